"""IDENTIFY response parsing (feature negotiation)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nsq_sync.errors import RemoteProtocolError
from nsq_sync.protocol.constants import OK

#: nsqd's default --max-rdy-count, assumed when the server did not negotiate features
DEFAULT_MAX_RDY_COUNT = 2500


@dataclass(frozen=True)
class IdentifyResult:
    """What nsqd answered to IDENTIFY; durations in float seconds. ``negotiated`` is False after a
    bare ``OK`` (no feature negotiation); every other field then holds its default."""

    negotiated: bool = False
    max_rdy_count: int = DEFAULT_MAX_RDY_COUNT
    version: str = ""
    max_msg_timeout: float | None = None
    msg_timeout: float | None = None
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 0
    max_deflate_level: int = 0
    sample_rate: int = 0
    auth_required: bool = False
    output_buffer_size: int = 0
    output_buffer_timeout: float | None = None

    @classmethod
    def parse(cls, data: bytes) -> IdentifyResult:
        """Parse the IDENTIFY answer; RemoteProtocolError if neither ``OK`` nor a JSON object."""
        if data == OK:
            return cls()
        try:
            obj: Any = json.loads(data)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            raise RemoteProtocolError(f"unexpected IDENTIFY response {data[:100]!r}")

        def seconds(key: str) -> float | None:
            value = obj.get(key)
            return value / 1000.0 if isinstance(value, (int, float)) and value >= 0 else None

        return cls(
            negotiated=True,
            max_rdy_count=int(obj.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT)),
            version=str(obj.get("version", "")),
            max_msg_timeout=seconds("max_msg_timeout"),
            msg_timeout=seconds("msg_timeout"),
            tls_v1=bool(obj.get("tls_v1", False)),
            snappy=bool(obj.get("snappy", False)),
            deflate=bool(obj.get("deflate", False)),
            deflate_level=int(obj.get("deflate_level", 0)),
            max_deflate_level=int(obj.get("max_deflate_level", 0)),
            sample_rate=int(obj.get("sample_rate", 0)),
            auth_required=bool(obj.get("auth_required", False)),
            output_buffer_size=int(obj.get("output_buffer_size", 0)),
            output_buffer_timeout=seconds("output_buffer_timeout"),
        )
