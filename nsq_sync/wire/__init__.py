"""One nsqd TCP connection: socket (transport.py, the only socket user), handshake (handshake.py,
tls.py), reader task (connection.py), requests matched to answers (requests.py)."""

from nsq_sync.wire.connection import ConnectionHandler, NsqdConnection
from nsq_sync.wire.requests import NotSent

__all__ = ["ConnectionHandler", "NotSent", "NsqdConnection"]
