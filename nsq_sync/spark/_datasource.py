"""The ``nsq`` DataSource: options and schemas are checked here, while Spark plans the query.

Spark constructs and pickles the DataSource, its writers and its readers in several processes,
so nothing here opens a socket or starts a thread. The writers and readers are imported when
one is made: a fresh Python process that Spark starts for a query's planning (the schema, the
options) imports neither the consumer nor the producer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from nsq_sync.errors import ConfigError
from nsq_sync.spark._options import sink_options, source_options

if TYPE_CHECKING:
    from nsq_sync.spark._source import NsqStreamReader

__all__ = ["SOURCE_SCHEMA", "NsqDataSource"]

#: the rows the streaming source produces
SOURCE_SCHEMA = (
    "id string, body binary, timestamp timestamp, attempts int, nsqd_address string, "
    "topic string, channel string"
)


def source_struct() -> StructType:
    """:data:`SOURCE_SCHEMA` as a StructType (``StructType.fromDDL`` needs a live session,
    which the planner processes do not have)."""
    return StructType(
        [
            StructField("id", StringType()),
            StructField("body", BinaryType()),
            StructField("timestamp", TimestampType()),
            StructField("attempts", IntegerType()),
            StructField("nsqd_address", StringType()),
            StructField("topic", StringType()),
            StructField("channel", StringType()),
        ]
    )


class NsqDataSource(DataSource):
    """Spark data source ``nsq``: a sink (batch and streaming) and a streaming source.

    Register it once per SparkSession with ``spark.dataSource.register(NsqDataSource)``.
    docs/spark.md describes the options and their defaults; any Config option is accepted too.

    Sink (``df.write`` / ``df.writeStream``): a ``body`` column (binary or string) and optionally
    ``topic`` (string; a null topic goes to the ``topic`` option). Options:
    ``nsqd_tcp_addresses`` (required), ``topic``, ``batch_size``.

    Source (``spark.readStream``): options ``topic``, ``channel``, ``nsqd_tcp_addresses`` and/or
    ``lookupd_http_addresses``, ``max_messages_per_batch``, ``commit_flush_after``,
    ``drain_idle_timeout``; with ``parallelism`` (executors read), ``staging_location`` and
    ``nsqd_http_addresses``, ``partition_timeout``, ``chunk_size``.

    Raises (while Spark plans the query, before anything is sent):
        ConfigError: a missing, unknown or invalid option, or a bad column, named.
    """

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from nsq_sync.spark._sink import NsqWriter

        options = sink_options(self.options)
        return NsqWriter(options, _sink_columns(schema, options.topic, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from nsq_sync.spark._sink import NsqStreamWriter

        options = sink_options(self.options)
        return NsqStreamWriter(options, _sink_columns(schema, options.topic, overwrite))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The parallel source (option ``parallelism``); without it Spark falls back to
        :meth:`simpleStreamReader`, the driver-side source."""
        options = source_options(self.options)
        if not options.parallelism:
            return super().streamReader(schema)  # raises PySparkNotImplementedError
        from nsq_sync.spark._parallel import NsqParallelStreamReader, require_admission_control
        from nsq_sync.spark._staging import Staging

        require_admission_control()
        expected = _source_schema(schema)
        Staging(options.staging_location or "").check_writable()
        return NsqParallelStreamReader(options, expected)

    def simpleStreamReader(self, schema: StructType) -> NsqStreamReader:
        from nsq_sync.spark._source import NsqStreamReader

        options = source_options(self.options)
        return NsqStreamReader(options, _source_schema(schema))


def _source_schema(schema: StructType | None) -> StructType:
    """The columns the source builds: all of :data:`SOURCE_SCHEMA`, or the ones a user schema
    (``spark.readStream.schema(...)``) selects, in its order.

    Raises:
        ConfigError: the user schema names a column the source does not have, one twice, or
            one with another type.
    """
    every = source_struct()
    if schema is None:
        return every
    types = {f.name: f.dataType for f in every.fields}
    seen: set[str] = set()
    for field in schema.fields:
        if field.name not in types:
            raise ConfigError(
                f"the nsq source has no column {field.name!r}: a schema selects columns of "
                f"{SOURCE_SCHEMA}"
            )
        if field.name in seen:
            raise ConfigError(f"the schema names column {field.name!r} twice")
        if field.dataType != types[field.name]:
            raise ConfigError(
                f"column {field.name!r} of the nsq source is "
                f"{types[field.name].simpleString()}, not {field.dataType.simpleString()}"
            )
        seen.add(field.name)
    if not seen:
        raise ConfigError(f"the schema selects no column of {SOURCE_SCHEMA}")
    return StructType([StructField(f.name, types[f.name]) for f in schema.fields])


def _sink_columns(schema: StructType, topic_option: str | None, overwrite: bool) -> dict[str, Any]:
    """Which columns hold the body and the topic, and whether the body is text.

    Raises:
        ConfigError: overwrite mode, no ``body`` column, a column of the wrong type, a column
            the sink would drop, or neither a ``topic`` column nor a ``topic`` option.
    """
    if overwrite:
        raise ConfigError(
            "the nsq sink only appends (publishing cannot overwrite): use mode('append')"
        )
    fields = {f.name.lower(): f for f in schema.fields}
    body = fields.get("body")
    if body is None:
        raise ConfigError(
            f"the nsq sink needs a column 'body' (binary or string); the DataFrame has "
            f"{schema.simpleString()}"
        )
    if not isinstance(body.dataType, (BinaryType, StringType)):
        raise ConfigError(
            f"column 'body' must be binary or string, not {body.dataType.simpleString()}"
        )
    topic = fields.get("topic")
    if topic is not None and not isinstance(topic.dataType, StringType):
        raise ConfigError(f"column 'topic' must be a string, not {topic.dataType.simpleString()}")
    if topic is None and topic_option is None:
        raise ConfigError("the nsq sink needs the option 'topic' or a column 'topic'")
    extra = sorted(set(fields) - {"body", "topic"})
    if extra:
        raise ConfigError(
            f"column(s) {', '.join(repr(fields[e].name) for e in extra)} would be dropped: the "
            "nsq sink publishes only 'body' (and routes by 'topic'); select those columns"
        )
    return {
        "body": body.name,
        "topic": None if topic is None else topic.name,
        "text": isinstance(body.dataType, StringType),
    }
