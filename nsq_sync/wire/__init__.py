"""One nsqd TCP connection: the socket (transport.py, the only socket user; TLS and compression),
the handshake (handshake.py, with tls.py's contexts), the connection and its reader task
(connection.py), and requests matched to answers (requests.py)."""

from nsq_sync.wire.connection import ConnectionHandler, NsqdConnection
from nsq_sync.wire.requests import NotSent

__all__ = ["ConnectionHandler", "NotSent", "NsqdConnection"]
