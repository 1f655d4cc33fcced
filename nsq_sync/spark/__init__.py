"""PySpark data source ``nsq``: DataFrames to NSQ and NSQ to DataFrames, at least once.

Register :class:`NsqDataSource` with ``spark.dataSource.register`` (docs/spark.md has the
options). Needs the ``spark`` extra; ``import nsq_sync`` never imports pyspark, only
``import nsq_sync.spark`` does. nsq_sync must be installed where the executors' Python runs.
"""

from __future__ import annotations

from nsq_sync._version import install_hint

try:
    import pyarrow  # noqa: F401  (the writer and the reader move rows as Arrow batches)
    import pyspark
    from pyspark.sql.datasource import DataSource  # noqa: F401  (pyspark >= 4.0)
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the unit tests
    raise ImportError(
        f"nsq_sync.spark needs pyspark >= 4.0, pyarrow and pandas: {install_hint('spark')} ({exc})"
    ) from exc

from nsq_sync.spark._datasource import SOURCE_SCHEMA, NsqDataSource
from nsq_sync.spark._sink import NsqCommitMessage

__all__ = ["SOURCE_SCHEMA", "NsqCommitMessage", "NsqDataSource", "pyspark"]
