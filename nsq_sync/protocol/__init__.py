"""Sans-IO NSQ protocol: command encoders, an incremental frame decoder, message parsing.

Nothing here touches sockets, threads or clocks, and nothing of nsq_sync is imported but
:mod:`nsq_sync.errors`.
"""

from __future__ import annotations

from nsq_sync.protocol import commands
from nsq_sync.protocol.constants import (
    CLOSE_WAIT,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
)
from nsq_sync.protocol.decoder import EOF, NEED_DATA, FrameDecoder, parse_message
from nsq_sync.protocol.events import (
    ErrorFrame,
    Event,
    Heartbeat,
    MessageFrame,
    RawMessage,
    Response,
)
from nsq_sync.protocol.names import is_valid_name, validate_channel, validate_topic

__all__ = [
    "CLOSE_WAIT",
    "EOF",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "HEARTBEAT",
    "MAGIC_V2",
    "NEED_DATA",
    "OK",
    "ErrorFrame",
    "Event",
    "FrameDecoder",
    "Heartbeat",
    "MessageFrame",
    "RawMessage",
    "Response",
    "commands",
    "is_valid_name",
    "parse_message",
    "validate_channel",
    "validate_topic",
]
