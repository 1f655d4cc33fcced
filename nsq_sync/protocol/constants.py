"""Wire constants of the NSQ V2 protocol (see the TCP protocol spec)."""

from __future__ import annotations

MAGIC_V2 = b"  V2"

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

#: timestamp (8) + attempts (2) + id (16)
MESSAGE_HEADER_SIZE = 26
MESSAGE_ID_SIZE = 16

MAX_NAME_LENGTH = 64

#: Default upper bound on a single frame. nsqd's own default --max-msg-size is 1 MiB, and
#: --max-body-size (MPUB) 5 MiB; frames the client receives are messages, so 1 MiB + header
#: would do, but users raise --max-msg-size; 64 MiB keeps garbage from allocating gigabytes.
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024

#: nsqd's default --max-msg-size and --max-body-size (v1.3.0 nsqd/options.go)
DEFAULT_MAX_MSG_SIZE = 1024 * 1024
DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024
