"""The only socket user: a TCP connection with optional TLS and compression layers.

- TLS runs on :class:`ssl.SSLObject` over memory BIOs, not :class:`ssl.SSLSocket`: the reader
  decrypts while other threads encrypt, and one SSL object must not be used by two threads at
  once. Every OpenSSL call is short and made under ``_tls_lock``; socket I/O happens outside it.
- The socket is duplicated so reads have ``read_timeout`` and writes ``write_timeout``.
- One writer at a time (the role is taken under ``_buf_lock``). Lock order: ``_write_lock``
  before ``_tls_lock``; ``_write_lock`` matters only under TLS, where the reader writes too.
"""

from __future__ import annotations

import socket
import ssl
import struct
import sys
import time
from typing import Any

from nsq_sync import process
from nsq_sync.addresses import parse_address
from nsq_sync.errors import (
    ConnectionClosed,
    ConnectTimeout,
    NSQConnectionError,
    ReadTimeout,
    TLSError,
)
from nsq_sync.protocol.codecs import Codec
from nsq_sync.runtime import Runtime

_RECV_SIZE = 256 * 1024  # largest read buffer (a busy consumer's)
_RECV_MIN = 16 * 1024  # first read buffer; it grows while reads fill it
_TIMEVAL = struct.Struct("@ll")  # struct timeval, for SO_RCVTIMEO / SO_SNDTIMEO


class Transport:
    """A connected socket plus optional TLS and compression. ``recv`` from one reader at a time;
    ``send`` is thread-safe."""

    def __init__(
        self,
        runtime: Runtime,
        address: str,
        *,
        dial_timeout: float,
        read_timeout: float,
        write_timeout: float,
    ) -> None:
        self.address = address
        self._runtime = runtime
        self._write_lock = runtime.lock()
        self._tls_lock = runtime.lock()
        self._tls: ssl.SSLObject | None = None
        self._tls_in: ssl.MemoryBIO | None = None
        self._tls_out: ssl.MemoryBIO | None = None
        self._codec: Codec | None = None
        self._read_ahead = b""  # plaintext decoded from bytes read before a codec was installed
        # Commands waiting to be written; one task at a time (the writer) writes them, so
        # commands from concurrent tasks go out together (see send/buffer).
        self._buf: list[bytes] = []
        self._buf_lock = runtime.lock()
        self._writing = False
        self.closed = False
        host, port = parse_address(address)
        made_in = process.Stamp()
        try:
            sock = runtime.create_connection((host, port), dial_timeout)
        except socket.timeout as exc:
            raise ConnectTimeout(f"connect timed out after {dial_timeout} s", address) from exc
        except OSError as exc:
            raise NSQConnectionError(f"cannot connect: {exc}", address) from exc
        if not made_in.is_current():
            # Under gevent a dial in progress at a fork resumes in the child too, on the same
            # socket: it belongs to the parent (see nsq_sync.process).
            process.close_socket(sock)
            raise NSQConnectionError("the process forked while connecting", address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._rsock: Any = sock
        self._wsock: Any = sock.dup()
        # Plain threads: blocking sockets with the kernel enforcing the timeouts (SO_RCVTIMEO /
        # SO_SNDTIMEO). A Python-level timeout polls before every recv and send: a system call
        # more, and one more release and re-acquisition of the GIL, per operation. gevent's
        # cooperative sockets keep their own timeouts.
        self._kernel_timeouts = (
            runtime.name == "threads"
            and sys.platform != "win32"  # (Windows takes milliseconds, not a struct timeval)
            and not type(sock).__module__.startswith("gevent")  # threads runtime, patched socket
        )
        if self._kernel_timeouts:
            sock.settimeout(None)  # blocking (both descriptors share the file status)
            self._wsock.settimeout(None)  # and no Python-level poll before each send
        self._set_timeout(self._rsock, read_timeout)
        self._set_timeout(self._wsock, write_timeout, write=True)
        self._write_timeout = write_timeout
        self._rtimeout = read_timeout
        # recv_into a reused buffer: recv(n) allocates n bytes per call (for 256 KiB an mmap,
        # an mremap to the size read and a munmap later, with fresh pages faulted in each time).
        # It starts small (an idle or publishing connection never needs more) and grows up to
        # _RECV_SIZE while reads fill it (a busy consumer: fewer, larger reads).
        self._rbuf = bytearray(_RECV_MIN)
        self._rview = memoryview(self._rbuf)
        self.read_timeout = read_timeout

    def _set_timeout(self, sock: Any, timeout: float, write: bool = False) -> None:
        """The read (or write) timeout, in the kernel (plain threads) or on the Python socket."""
        if not self._kernel_timeouts:
            sock.settimeout(timeout)
            return
        seconds = max(timeout, 0.0001)
        sec = int(seconds)
        option = socket.SO_SNDTIMEO if write else socket.SO_RCVTIMEO
        sock.setsockopt(
            socket.SOL_SOCKET, option, _TIMEVAL.pack(sec, max(1, int((seconds - sec) * 1e6)))
        )

    def enable_keepalive(self) -> None:
        """Turn on TCP keepalive (connections without heartbeats still notice dead peers)."""
        self._rsock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    # ------------------------------------------------------------------ upgrades (handshake only)

    def start_tls(
        self, context: ssl.SSLContext, server_hostname: str | None, initial: bytes
    ) -> None:
        """Run the TLS handshake; ``initial``: bytes already read past the IDENTIFY answer. Raises
        TLSError when it fails (certificate not verified, protocol mismatch)."""
        self._tls_in = ssl.MemoryBIO()
        self._tls_out = ssl.MemoryBIO()
        try:
            tls = context.wrap_bio(self._tls_in, self._tls_out, server_hostname=server_hostname)
        except (ValueError, ssl.SSLError) as exc:
            raise TLSError(f"cannot start TLS: {exc}", self.address) from exc
        if initial:
            self._tls_in.write(initial)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_raw(self._tls_out.read())
                data = self._recv_raw()
                if not data:
                    raise TLSError(
                        "connection closed during the TLS handshake", self.address
                    ) from None
                self._tls_in.write(data)
            except ssl.SSLCertVerificationError as exc:
                raise TLSError(
                    f"TLS certificate did not verify: {exc.verify_message}", self.address
                ) from exc
            except ssl.SSLError as exc:
                raise TLSError(f"TLS handshake failed: {exc}", self.address) from exc
        self._send_raw(self._tls_out.read())
        self._tls = tls

    def install_codec(self, codec: Codec, initial: bytes) -> None:
        """Compress from now on; ``initial`` (plaintext already read) is decoded first."""
        self._codec = codec
        if initial:
            self._read_ahead = codec.decompress(initial)

    @property
    def tls_version(self) -> str | None:
        return self._tls.version() if self._tls is not None else None

    # ------------------------------------------------------------------ I/O

    def recv(self, timeout: float | None = None) -> bytes:
        """The next plaintext bytes (``b""``: the peer closed), within ``timeout`` (None:
        ``read_timeout``). One reader at a time. Raises ReadTimeout, ConnectionClosed (closed
        locally) or NSQConnectionError."""
        if self._read_ahead:
            data, self._read_ahead = self._read_ahead, b""
            return data
        if timeout is not None:
            # settimeout() is a system call: skip it while the current value is between half
            # and 110 % of the one asked for (a caller's deadline is overshot by at most 10 %;
            # a shorter socket timeout is retried by the caller until its deadline).
            current = self._rtimeout
            if not timeout * 0.5 <= current <= timeout * 1.1:
                self._rtimeout = current = max(timeout, 0.0001)
                self._set_timeout(self._rsock, current)
        if self._tls is None and self._codec is None:
            return self._recv_raw()
        while True:
            raw = self._recv_raw()
            if not raw:
                return b""
            if self._tls is not None:
                raw = self._decrypt(raw)
            if self._codec is not None and raw:
                raw = self._codec.decompress(raw)
            if raw:
                return raw

    def send(self, data: bytes) -> None:
        """Write ``data`` (compressed and encrypted as negotiated). Thread-safe. While another task
        writes, ``data`` joins what it writes next and this returns at once (a failure then closes
        the connection). Raises ConnectionClosed or NSQConnectionError (a write timeout too)."""
        first = self.enqueue(data)
        if first is not None:
            self.drain(first)

    def enqueue(self, data: bytes) -> bytes | None:
        """Hand ``data`` to the writer. Thread-safe. None when another task is writing (it writes
        ``data`` next); else the caller is the writer and must :meth:`drain` the bytes returned."""
        # `with`, not acquire()/release(): a KeyboardInterrupt delivered as acquire() returns
        # would leave the lock held, and every later write (and close()) would wait on it.
        with self._buf_lock:
            if self._writing:
                self._buf.append(data)
                return None
            self._writing = True
            buf = self._buf
            if buf:  # (commands buffered for a flush go first)
                buf.append(data)
                data = b"".join(buf)
                buf.clear()
        return data

    def buffer(self, data: bytes) -> bool:
        """Buffer ``data`` for the next write (one write per batch of FIN/REQ). Thread-safe. True
        when the buffer was empty: the caller must make sure a flush follows."""
        with self._buf_lock:
            self._buf.append(data)
            return len(self._buf) == 1 and not self._writing

    def flush(self, wait: bool = False) -> None:
        """Write what is buffered, unless another task is writing it now. Thread-safe. ``wait``:
        first wait for that write (up to ``write_timeout``): closing must not cut off a FIN or REQ.
        """
        deadline = None
        while True:
            with self._buf_lock:
                if not self._writing:
                    if not self._buf:
                        return
                    self._writing = True
                    break
            if not wait:
                return
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._write_timeout
            elif now >= deadline:
                return
            self._runtime.sleep(0.001)
        self.drain()

    def drain(self, first: bytes | None = None) -> None:
        """As the writer: write ``first``, then the buffer till it is empty, then give the role up.
        A write that fails (other than by the peer closing) closes the transport: part of a command
        may be out, so nothing may follow on this stream. Buffered commands are dropped with it."""
        buf = self._buf
        lock = self._buf_lock
        data = first
        try:
            while True:
                if data is None:
                    with lock:
                        if not buf:
                            self._writing = False
                            return
                        data = buf[0] if len(buf) == 1 else b"".join(buf)
                        buf.clear()
                if self._tls is None:
                    # Plain TCP: the writer role alone orders the writes (_write_lock only
                    # keeps the TLS reader's own writes out of the middle of a record).
                    if self._codec is not None:
                        data = self._codec.compress(data)
                    self._send_raw(data)
                else:
                    with self._write_lock:
                        self._send_locked(data)
                data = None
        except BaseException as exc:
            if not isinstance(exc, ConnectionClosed):
                # (ConnectionClosed: the peer closed or reset it, so every later write fails
                # too; the socket stays open for the answers nsqd sent before it closed.)
                self.close()  # before giving up the role: nothing may follow a torn write
            with lock:
                self._writing = False
                buf.clear()
            raise

    def _send_locked(self, data: bytes) -> None:
        if self._codec is not None:
            data = self._codec.compress(data)
        if self._tls is not None:
            with self._tls_lock:
                self._tls.write(data)
                data = self._tls_out.read()  # type: ignore[union-attr]
        self._send_raw(data)

    def _decrypt(self, raw: bytes) -> bytes:
        assert self._tls is not None and self._tls_in is not None and self._tls_out is not None
        chunks = []
        with self._tls_lock:
            self._tls_in.write(raw)
            while True:
                try:
                    chunk = self._tls.read(_RECV_SIZE)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    break
                except ssl.SSLError as exc:
                    raise TLSError(f"TLS error: {exc}", self.address) from exc
                if not chunk:
                    break
                chunks.append(chunk)
            pending_out = self._tls_out.pending
        if pending_out:  # e.g. the answer to a TLS 1.3 key update
            with self._write_lock:
                with self._tls_lock:
                    out = self._tls_out.read()
                self._send_raw(out)
        return b"".join(chunks)

    def _recv_raw(self) -> bytes:
        if self.closed:  # (also set in a forked child before its socket copy is closed)
            raise ConnectionClosed("connection closed", self.address, by_server=False)
        try:
            n = self._rsock.recv_into(self._rbuf)
            data = bytes(self._rview[:n])
            if n == len(self._rbuf) and n < _RECV_SIZE:
                self._rbuf = bytearray(min(n * 4, _RECV_SIZE))
                self._rview = memoryview(self._rbuf)
            return data
        except (socket.timeout, BlockingIOError) as exc:  # BlockingIOError: SO_RCVTIMEO expired
            if self.closed:
                raise ConnectionClosed("connection closed", self.address, by_server=False) from exc
            raise ReadTimeout(f"no data from nsqd for {self._rtimeout} s", self.address) from exc
        except OSError as exc:
            if self.closed:
                raise ConnectionClosed("connection closed", self.address, by_server=False) from exc
            raise NSQConnectionError(f"read failed: {exc}", self.address) from exc

    def _send_raw(self, data: bytes) -> None:
        if not data:
            return
        if self.closed:
            raise ConnectionClosed("connection closed", self.address, by_server=False)
        try:
            self._wsock.sendall(data)
        except (socket.timeout, BlockingIOError) as exc:  # BlockingIOError: SO_SNDTIMEO expired
            raise NSQConnectionError("write timed out", self.address) from exc
        except OSError as exc:
            raise ConnectionClosed(f"write failed: {exc}", self.address) from exc

    def abandon(self) -> None:
        """Fork hook: close our descriptors without shutting the connection down (the parent still
        uses it). Takes no lock; idempotent."""
        self.closed = True
        for sock in (self._wsock, self._rsock):
            process.close_socket(sock)  # close(2) only; shutdown(2) would cut the parent too

    def close(self) -> None:
        """Close both socket handles; a reader blocked in :meth:`recv` wakes up. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for sock in (self._rsock, self._wsock):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for sock in (self._wsock, self._rsock):
            try:
                sock.close()
            except OSError:
                pass
