"""Stream codecs of the compression upgrades (bytes in, bytes out): raw DEFLATE with each write
flushed (Z_SYNC_FLUSH, so nsqd decodes it at once), and the snappy *framing* format, whose
python-snappy is imported only when snappy is negotiated."""

from __future__ import annotations

import zlib
from typing import Any, Protocol

from nsq_sync._version import install_hint
from nsq_sync.errors import RemoteProtocolError


class Codec(Protocol):
    name: str

    def compress(self, data: bytes) -> bytes: ...

    def decompress(self, data: bytes) -> bytes: ...


class DeflateCodec:
    """Raw deflate in both directions. Not thread-safe: the transport serialises each side."""

    name = "deflate"

    def __init__(self, level: int = 6) -> None:
        self._c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._d = zlib.decompressobj(-zlib.MAX_WBITS)

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> bytes:
        try:
            return self._d.decompress(data)
        except zlib.error as exc:
            raise RemoteProtocolError(f"invalid deflate stream: {exc}") from exc


class SnappyCodec:
    """Snappy framing format in both directions (python-snappy)."""

    name = "snappy"

    def __init__(self) -> None:
        try:
            import snappy
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from nsq_sync.errors import ConfigError

            raise ConfigError(f"snappy=True needs python-snappy: {install_hint('snappy')}") from exc
        self._c: Any = snappy.StreamCompressor()
        self._d: Any = snappy.StreamDecompressor()

    def compress(self, data: bytes) -> bytes:
        return bytes(self._c.add_chunk(data))

    def decompress(self, data: bytes) -> bytes:
        try:
            return bytes(self._d.decompress(data))
        except Exception as exc:  # python-snappy/cramjam raise their own error types
            raise RemoteProtocolError(f"invalid snappy stream: {exc}") from exc
