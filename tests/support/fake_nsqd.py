"""A scripted fake nsqd on 127.0.0.1:0, for byte-level edge cases a real nsqd never produces.

It speaks just enough of the protocol to get a real Consumer or Producer past the handshake
(magic, IDENTIFY answered with a feature-negotiation JSON, SUB answered with OK) and then sends
whatever bytes the test scripted: garbage, truncated frames, absurd frame sizes, unknown frame
types, unsolicited responses, error frames. After the script it half-closes (FIN), reads what the
client still sends until the client closes, and records every command it received.

    def script(index: int) -> bytes | None:      # None: behave (answer PUB with OK, CLS...)
        return b"garbage" if index == 0 else None

A script may also be a list of byte strings and ``EXPECT_NOP`` markers: at a marker the server
waits until the client answered (a heartbeat) with NOP before it sends the rest.

    with FakeNsqd(script, mode="consumer") as fake:
        consumer = Consumer("t", "c", handler, nsqd_tcp_addresses=fake.address)
        ...
        wait_for(lambda: fake.subscribed >= 2, "a reconnect")

``mode="consumer"``: the script is sent right after the OK to SUB (after the client's first RDY,
so messages are legitimately deliverable). ``mode="producer"``: the script is the answer to the
first PUB/MPUB/DPUB. Well-behaved connections (script ``None``) answer SUB and publishes with OK
and CLS with CLOSE_WAIT, and otherwise wait for the client.

Everything is bounded: sockets have timeouts, and ``close()`` resets open connections. It is a
test double for edge cases only; it never replaces the real nsqd (DESIGN.md).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EXPECT_NOP", "IDENTIFY_RESPONSE", "FakeNsqd", "frame", "message_frame"]

#: In a script given as a list: wait (bounded) until the client sent NOP before going on.
EXPECT_NOP = object()
_EXPECT_TIMEOUT = 5.0

IDENTIFY_RESPONSE = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 0,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}

_TIMEOUT = 10.0  # bounds every blocking call on a connection
_WITH_BODY = (b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB")


def frame(frame_type: int, data: bytes) -> bytes:
    """``[size][type][data]`` as nsqd writes it."""
    return struct.pack(">ll", len(data) + 4, frame_type) + data


def message_frame(msg_id: bytes, body: bytes, attempts: int = 1, timestamp: int = 0) -> bytes:
    """A message frame (type 2) with a 16-byte id."""
    return frame(2, struct.pack(">qH", timestamp, attempts) + msg_id.ljust(16, b"0")[:16] + body)


@dataclass
class Connection:
    """What one client connection sent, in order (command lines, without bodies)."""

    index: int
    commands: list[bytes] = field(default_factory=list)
    scripted: bool = False
    closed: threading.Event = field(default_factory=threading.Event)
    accepted_at: float = field(default_factory=time.monotonic)  # when the fake accepted it

    def count(self, name: bytes) -> int:
        return sum(1 for c in self.commands if c.split(b" ", 1)[0] == name)


class _Closed(Exception):
    pass


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise _Closed()
        self.buf += data

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            if len(self.buf) > 1 << 20:
                raise _Closed()
            self._fill()
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def command(self) -> tuple[bytes, bytes]:
        """One command: (line, body) where body is b"" for commands without one."""
        line = self.line()
        if line.split(b" ", 1)[0] in _WITH_BODY:
            (size,) = struct.unpack(">l", self.exactly(4))
            return line, self.exactly(max(0, size))
        return line, b""


class FakeNsqd:
    """A loopback fake nsqd; see the module docstring.

    Args:
        script: ``script(connection_index) -> bytes | None``: what to send on that connection
            (``None`` for a well-behaved connection).
        mode: ``"consumer"`` or ``"producer"``.
        identify: the IDENTIFY answer (a dict sent as JSON).
    """

    def __init__(
        self,
        script: Callable[[int], bytes | list[Any] | None],
        *,
        mode: str = "consumer",
        identify: dict[str, object] | None = None,
    ) -> None:
        if mode not in ("consumer", "producer"):
            raise ValueError(f"mode must be 'consumer' or 'producer', got {mode!r}")
        self.script = script
        self.mode = mode
        self.identify = dict(IDENTIFY_RESPONSE if identify is None else identify)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.05)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self.connections: list[Connection] = []
        self.subscribed = 0  # connections that got OK to SUB
        self.published: list[bytes] = []  # bodies answered with OK
        self.errors: list[BaseException] = []  # unexpected failures of the fake itself
        self.returned_at: float | None = None  # the test's: when the call it timed returned
        self._spawn(self._accept_loop, "accept")

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(_TIMEOUT)

    def __enter__(self) -> FakeNsqd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=f"fake-nsqd-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(_TIMEOUT)
            with self._lock:
                conn = Connection(len(self.connections))
                self.connections.append(conn)
                self._socks.append(sock)
            self._spawn(self._serve, f"conn-{conn.index}", sock, conn)

    def _serve(self, sock: socket.socket, conn: Connection) -> None:
        reader = _Reader(sock)
        try:
            if reader.exactly(4) != b"  V2":
                return
            script = self.script(conn.index)
            conn.scripted = script is not None
            while True:
                line, body = reader.command()
                conn.commands.append(line)
                name = line.split(b" ", 1)[0]
                if name == b"IDENTIFY":
                    sock.sendall(frame(0, json.dumps(self.identify).encode()))
                elif name == b"SUB":
                    sock.sendall(frame(0, b"OK"))
                    with self._lock:
                        self.subscribed += 1
                elif name == b"RDY" and script is not None and self.mode == "consumer":
                    self._play(sock, reader, conn, script)
                    return
                elif name in (b"PUB", b"MPUB", b"DPUB"):
                    if script is not None and self.mode == "producer":
                        self._play(sock, reader, conn, script)
                        return
                    sock.sendall(frame(0, b"OK"))
                    with self._lock:
                        self.published.append(body)
                elif name == b"CLS":
                    sock.sendall(frame(0, b"CLOSE_WAIT"))
        except (_Closed, OSError):
            pass
        except BaseException as exc:  # a bug in the fake: make the test see it
            self.errors.append(exc)
        finally:
            conn.closed.set()
            with contextlib.suppress(OSError):
                sock.close()

    def _play(
        self, sock: socket.socket, reader: _Reader, conn: Connection, script: bytes | list[Any]
    ) -> None:
        """Send the script, half-close, and record what the client sends until it closes."""
        for item in [script] if isinstance(script, bytes) else script:
            if item is EXPECT_NOP:
                sock.settimeout(_EXPECT_TIMEOUT)
                while True:
                    line, _ = reader.command()
                    conn.commands.append(line)
                    if line == b"NOP":
                        break
                sock.settimeout(_TIMEOUT)
            elif item:
                sock.sendall(item)
        sock.shutdown(socket.SHUT_WR)
        while True:
            line, _ = reader.command()
            conn.commands.append(line)
