"""A real HTTP auth server for nsqd's ``--auth-http-address``, on ``127.0.0.1:0`` in a thread.

nsqd asks ``GET /auth?secret=...&remote_ip=...&tls=...`` and expects
``{"ttl": ..., "identity": ..., "identity_url": ..., "authorizations": [...]}``. Each secret maps
to a reply; unknown secrets get ``{"ttl": 3600, "authorizations": []}`` (no permissions, which
nsqd reports as ``E_UNAUTHORIZED``). Every request is recorded.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["AuthServer", "grant"]


def grant(
    topic: str = ".*",
    channels: tuple[str, ...] = (".*",),
    permissions: tuple[str, ...] = ("subscribe", "publish"),
    identity: str = "test-user",
    ttl: int = 3600,
) -> dict[str, Any]:
    """An auth reply granting ``permissions`` on topics matching ``topic`` (a regex)."""
    return {
        "ttl": ttl,
        "identity": identity,
        "identity_url": "",
        "authorizations": [
            {"permissions": list(permissions), "topic": topic, "channels": list(channels)}
        ],
    }


class AuthServer:
    """``with AuthServer({"good": grant()}) as auth: ... auth.address ...``.

    Args:
        replies: secret -> JSON reply (a dict), or secret -> (status, body) for other answers.
    """

    def __init__(self, replies: dict[str, Any]) -> None:
        self.replies = dict(replies)
        self.requests: list[dict[str, str]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                with server._lock:
                    server.requests.append({"path": url.path, **query})
                reply = server.replies.get(query.get("secret", ""))
                if url.path != "/auth":
                    status, body = 404, b"not found"
                elif isinstance(reply, tuple):
                    status, body = reply[0], str(reply[1]).encode()
                else:
                    reply = reply if reply is not None else {"ttl": 3600, "authorizations": []}
                    status, body = 200, json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # keep test output clean

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{host}:{port}"

    def secrets_seen(self) -> list[str]:
        with self._lock:
            return [r.get("secret", "") for r in self.requests]

    def start(self) -> AuthServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="test-auth-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(10.0)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> AuthServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
