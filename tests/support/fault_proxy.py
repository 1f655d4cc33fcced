"""A TCP fault proxy between a client and a real nsqd, for reliability tests.

    with FaultProxy("127.0.0.1:4150") as proxy:      # listens on 127.0.0.1:<free port>
        consumer = Consumer(..., nsqd_tcp_addresses=[proxy.address])
        proxy.cut()          # reset every current connection (RST)
        proxy.stall()        # stop forwarding (connections stay open, bytes pile up)
        proxy.resume()
        proxy.delay(0.05)    # add latency to every chunk forwarded
        proxy.throttle(64 * 1024)   # bytes per second, each direction
        proxy.truncate(100)  # forward 100 more bytes nsqd -> client, then cut
        proxy.refuse()       # close new connections at once (accept()), until resume()
        proxy.hold(0.2)      # while nsqd is down, keep each new connection 0.2 s before closing
                             # it (as HAProxy or Envoy do while they retry the backend)

Only loopback. Every pump blocks with a short timeout so stop() is bounded; nothing here sleeps
for a fixed time except the delay/throttle the test asked for.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from typing import Any

_CHUNK = 65536
_POLL = 0.05


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()

    def reset(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                # SO_LINGER 0: close() sends RST, like a crashed peer or a dropped route
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.close()


class FaultProxy:
    """Forwards 127.0.0.1:<port> to ``upstream`` (``host:port``), with faults on command."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(_POLL)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False
        self._hold = 0.0
        self._delay = 0.0
        self._rate: float | None = None
        self._truncate_left: int | None = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self.accepted = 0
        self.cuts = 0
        self._spawn(self._accept_loop, "accept")

    # ------------------------------------------------------------------ faults

    def cut(self) -> int:
        """Reset every open connection; returns how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.reset()
        self.cuts += len(pairs)
        return len(pairs)

    def stall(self) -> None:
        """Stop forwarding in both directions; connections stay open."""
        self._flowing.clear()

    def resume(self) -> None:
        """Undo stall(), refuse(), delay(), throttle()."""
        self._refusing = False
        self._hold = 0.0
        self._delay = 0.0
        self._rate = None
        self._flowing.set()

    def delay(self, seconds: float) -> None:
        self._delay = seconds

    def throttle(self, bytes_per_second: float) -> None:
        self._rate = bytes_per_second

    def truncate(self, nbytes: int) -> None:
        """Forward ``nbytes`` more bytes from nsqd to clients, then cut (mid-frame)."""
        self._truncate_left = nbytes

    def hold(self, seconds: float) -> None:
        """When nsqd cannot be reached, keep the client's connection open ``seconds`` before
        closing it (instead of closing it at once). Stays on until resume()."""
        self._hold = seconds

    def refuse(self) -> None:
        """Close new connections as soon as they are accepted."""
        self._refusing = True

    @property
    def connections(self) -> int:
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed.is_set()]
            return len(self._pairs)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._stopped.set()
        self._flowing.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
        for thread in self._threads:
            thread.join(2.0)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=f"fault-proxy-{name}", daemon=True)
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            if self._refusing:
                _Pair(client, client).reset()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=2.0)
            except OSError:
                if self._hold:
                    self._spawn(self._close_later, "hold", client, self._hold)
                else:
                    _Pair(client, client).reset()
                continue
            for sock in (client, upstream):
                sock.settimeout(10.0)  # bounds a sendall to a peer that stopped reading
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
            self._spawn(self._pump, "up", pair, client, upstream, False)
            self._spawn(self._pump, "down", pair, upstream, client, True)

    def _close_later(self, client: socket.socket, seconds: float) -> None:
        self._stopped.wait(seconds)  # (the fault the test asked for; close() cuts it short)
        _Pair(client, client).reset()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        while not pair.closed.is_set() and not self._stopped.is_set():
            if not self._flowing.wait(_POLL):
                continue  # stalled: leave the bytes in the kernel buffers
            try:
                readable, _, _ = select.select([src], [], [], _POLL)
                if not readable:
                    continue
                data = src.recv(_CHUNK if self._rate is None else max(1, int(self._rate * _POLL)))
            except (OSError, ValueError):  # ValueError: the socket was closed by cut()
                break
            if not data:
                break
            if self._delay:
                time.sleep(self._delay)
            if self._rate:
                time.sleep(len(data) / self._rate)
            if downstream and self._truncate_left is not None:
                left = self._truncate_left
                data = data[:left]
                self._truncate_left = left - len(data)
            try:
                dst.sendall(data)
            except OSError:
                break
            if downstream and self._truncate_left == 0:
                self._truncate_left = None
                self.cut()
                return
        pair.reset()
