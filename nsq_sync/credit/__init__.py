"""A consumer's in-flight credit (RDY), as pure policy: the manager (manager.py), scarce credit's
rotation (rotation.py) and a run's budget (budget.py). No sockets, threads or clocks of its own:
the caller injects a clock and an RNG and sends the RDY updates it gets back."""

from nsq_sync.credit.manager import RDYManager
from nsq_sync.credit.state import Action

__all__ = ["Action", "RDYManager"]
