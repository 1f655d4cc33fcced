"""Run real ``nsqd`` and ``nsqlookupd`` processes on free loopback ports.

Like ``_base``, it imports nothing from ``nsq_sync`` outside this package.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import requests

from nsq_sync.testing._base import (
    DEFAULT_START_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    NsqProcess,
    NsqProcessError,
    StrPath,
    stop_all_running,
)
from nsq_sync.testing._binaries import NsqBinaryNotFound, find_nsq_binary

__all__ = [
    "DEFAULT_START_TIMEOUT",
    "DEFAULT_STOP_TIMEOUT",
    "Cluster",
    "NsqBinaryNotFound",
    "NsqProcess",
    "NsqProcessError",
    "NsqdProcess",
    "NsqlookupdProcess",
    "find_nsq_binary",
    "stop_all_running",
]

_TLS_FLAGS = ("tls-cert", "tls-key", "tls-root-ca-file")
# Every server listens on loopback only (see _base: ports are the kernel's choice).
_HOST = "127.0.0.1"

# nsqd derives its default --node-id (the prefix of every message ID it makes) from the hostname,
# so nsqds on one machine would share it and could hand out equal message IDs; give each its own.
_node_ids = itertools.count(random.randrange(1024))


def close_all(processes: Iterable[NsqProcess]) -> None:
    """Close every process, then raise the first :class:`NsqProcessError` if one failed."""
    errors: list[NsqProcessError] = []
    for proc in processes:
        try:
            proc.close()
        except NsqProcessError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def _has_flag(args: Iterable[str], flag: str) -> bool:
    return any(a.lstrip("-").split("=", 1)[0] == flag for a in args if a.startswith("-"))


class NsqdProcess(NsqProcess):
    """A real ``nsqd`` on loopback ports, with its own data path.

    Each instance in this Python process gets its own ``--node-id`` (up to 1024), so that
    message IDs from different nsqds don't collide. When ``extra_args`` turn TLS on without
    ``--https-address``, HTTPS gets a free loopback port too (nsqd's default is ``0.0.0.0:4152``).

    Args:
        lookupd_tcp_addresses: nsqlookupds to register with, as ``host:port`` TCP addresses or
            :class:`NsqlookupdProcess` objects.
        data_path: Where nsqd keeps its queues; ``<work_dir>/data`` when omitted.

    The other arguments are those of :class:`NsqProcess`.
    """

    name: ClassVar[str] = "nsqd"

    def __init__(
        self,
        *,
        lookupd_tcp_addresses: Iterable[str | NsqlookupdProcess] = (),
        extra_args: Sequence[str] = (),
        data_path: StrPath | None = None,
        binary: StrPath | None = None,
        work_dir: StrPath | None = None,
    ) -> None:
        super().__init__(extra_args=extra_args, binary=binary, work_dir=work_dir)
        self._lookupds = tuple(lookupd_tcp_addresses)
        self._data_path = Path(data_path) if data_path is not None else self._work_dir / "data"
        self._node_id = next(_node_ids) % 1024
        self._https = any(_has_flag(self._extra_args, f) for f in _TLS_FLAGS) and not _has_flag(
            self._extra_args, "https-address"
        )

    @property
    def data_path(self) -> Path:
        """Folder where nsqd keeps its on-disk queues and metadata."""
        return self._data_path

    @property
    def node_id(self) -> int:
        """The ``--node-id`` this nsqd runs with (unless ``extra_args`` override it)."""
        return self._node_id

    @property
    def lookupd_tcp_addresses(self) -> tuple[str, ...]:
        """The nsqlookupd TCP addresses this nsqd registers with."""
        return tuple(lk if isinstance(lk, str) else lk.tcp_address for lk in self._lookupds)

    @property
    def https_address(self) -> str | None:
        """``"127.0.0.1:port"`` of the HTTPS listener this class configured, else ``None``."""
        return self._addresses.get("HTTPS")

    def _expected_listeners(self) -> tuple[str, ...]:
        return ("TCP", "HTTP", "HTTPS") if self._https else ("TCP", "HTTP")

    def _command(self, ports: dict[str, int]) -> list[str]:
        self._data_path.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            f"--tcp-address={_HOST}:{ports['TCP']}",
            f"--http-address={_HOST}:{ports['HTTP']}",
            f"--broadcast-address={_HOST}",
            f"--data-path={self._data_path}",
            f"--node-id={self._node_id}",
        ]
        if self._https:
            args.append(f"--https-address={_HOST}:{ports.get('HTTPS', 0)}")
        args.extend(f"--lookupd-tcp-address={a}" for a in self.lookupd_tcp_addresses)
        args.extend(self._extra_args)
        return args


class NsqlookupdProcess(NsqProcess):
    """A real ``nsqlookupd`` on loopback ports; it takes the arguments of :class:`NsqProcess`."""

    name: ClassVar[str] = "nsqlookupd"

    def _command(self, ports: dict[str, int]) -> list[str]:
        return [
            self.binary,
            f"--tcp-address={_HOST}:{ports['TCP']}",
            f"--http-address={_HOST}:{ports['HTTP']}",
            f"--broadcast-address={_HOST}",
            *self._extra_args,
        ]

    def nodes(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Return the ``producers`` list of ``GET /nodes`` (the registered nsqds).

        Raises:
            requests.RequestException: The request failed or took over ``timeout`` seconds.
        """
        with requests.Session() as http:
            http.trust_env = False
            response = http.get(f"{self.http_url}/nodes", timeout=timeout)
            response.raise_for_status()
            body = response.json()
        data = body.get("data", body)  # nsqlookupd < 1.0 wrapped responses in "data"
        producers: list[dict[str, Any]] = data.get("producers") or []
        return producers

    def wait_for_nodes(
        self, nsqds: Iterable[NsqdProcess | str], timeout: float = DEFAULT_START_TIMEOUT
    ) -> None:
        """Wait until ``GET /nodes`` lists every given nsqd (a process or its TCP address).

        Raises:
            NsqProcessError: Some nsqd was not listed within ``timeout`` seconds.
        """
        wanted = {n if isinstance(n, str) else n.tcp_address for n in nsqds}
        deadline = time.monotonic() + timeout
        delay = 0.01
        seen: set[str] = set()
        while True:
            try:
                seen = {
                    f"{p.get('broadcast_address')}:{p.get('tcp_port')}"
                    for p in self.nodes(timeout=max(min(1.0, deadline - time.monotonic()), 0.05))
                }
            except requests.RequestException:
                pass
            if wanted <= seen:
                return
            now = time.monotonic()
            if now >= deadline:
                raise NsqProcessError(
                    self._describe_failure(
                        f"did not list {sorted(wanted - seen)} in /nodes within {timeout} s "
                        f"(listed: {sorted(seen)})"
                    )
                )
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.1)


@dataclass(frozen=True)
class Cluster:
    """One nsqlookupd (``lookupd``) and the nsqds registered with it (``nsqds``, start order)."""

    lookupd: NsqlookupdProcess
    nsqds: tuple[NsqdProcess, ...]

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        """``host:port`` TCP addresses of the nsqds."""
        return [n.tcp_address for n in self.nsqds]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        """The lookupd's HTTP base URL, in a list (the shape consumers take)."""
        return [self.lookupd.http_url]

    def processes(self) -> Iterator[NsqProcess]:
        """Yield the lookupd, then every nsqd."""
        yield self.lookupd
        yield from self.nsqds

    def close(self) -> None:
        """Stop every process (nsqds first), removing temporary folders they created.

        Raises:
            NsqProcessError: Some process could not be stopped (the others still are).
        """
        close_all((*self.nsqds, self.lookupd))
