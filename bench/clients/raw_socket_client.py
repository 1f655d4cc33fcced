"""A ceiling for the single-thread PUB workload: no library, a bare stdlib socket.

The same round trip every client pays, and nothing else: write ``PUB <topic>`` with one body,
block in recv() until nsqd's ``OK`` frame is complete, repeat. No validation, no timeouts, no
failover, no thread safety. It shows what bounds a synchronous publish on this machine (the
loopback round trip through nsqd), so a client's PUB rate can be read as a fraction of it.
"""

import json
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

_U32 = struct.Struct(">l")


def _connect(address):
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    identify = json.dumps({"heartbeat_interval": -1, "feature_negotiation": True}).encode()
    sock.sendall(b"IDENTIFY\n" + _U32.pack(len(identify)) + identify)
    _read_frame(sock)
    return sock


def _read_frame(sock):
    data = b""
    while len(data) < 4 or len(data) < 4 + _U32.unpack_from(data)[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("nsqd closed the connection")
        data += chunk
    return data[8:]


def run_pub(job, result):
    n = job["n"]
    command = b"PUB " + job["topic"].encode() + b"\n"
    data = _common.body(job["body_size"])
    command += _U32.pack(len(data)) + data
    deadline = _common.Deadline(job["timeout_s"])
    sock = _connect(job["nsqd"])
    sock.sendall(command)  # warm-up, as the clients' first publish
    if _read_frame(sock) != b"OK":
        raise RuntimeError("warm-up PUB not answered with OK")
    start = time.perf_counter()
    sent = 0
    while sent < n and not (sent % 1000 == 0 and deadline.expired()):
        sock.sendall(command)
        answer = sock.recv(65536)
        if answer[8:] != b"OK":  # OK frames are 10 bytes and arrive whole on loopback
            answer += b"" if len(answer) >= 10 else _read_frame(sock)
            if answer[8:10] != b"OK":
                raise RuntimeError(f"nsqd answered {answer!r}")
        sent += 1
    elapsed = time.perf_counter() - start
    sock.close()
    _common.rate_result(result, sent, elapsed)
    result.update(ok=sent == n, warmup_messages=1)


def run(job, result):
    if job["workload"] != "pub":
        raise ValueError(f"the raw socket ceiling only runs 'pub', not {job['workload']!r}")
    run_pub(job, result)


if __name__ == "__main__":
    _common.main(run, "raw-socket", lambda: "stdlib socket")
