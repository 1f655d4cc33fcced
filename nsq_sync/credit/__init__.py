"""A consumer's in-flight credit (RDY) as pure policy: no sockets, threads or clocks of its own."""

from nsq_sync.credit.manager import RDYManager
from nsq_sync.credit.state import Action

__all__ = ["Action", "RDYManager"]
