"""An S3 server on loopback for the Spark source's staging tests: gofakes3 (in memory), which
``scripts/build-nsq --s3`` builds into ``.nsq/bin`` (bootstrap does when the Spark tests run).

pyarrow's S3 filesystem reads its credentials and settings from the environment: :data:`S3_ENV`
must be in the environment of every process that opens the staging (the test process, the
Spark driver and the executors, which inherit it when it is set before Spark starts).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from support.nsq import wait_for

#: Fake credentials (gofakes3 checks none), no instance-metadata lookup (the only traffic is to
#: loopback), and request checksums only where S3 requires them: pyarrow's AWS SDK otherwise
#: streams uploads with trailing checksums and no Content-Length, which gofakes3 (as some other
#: S3-compatible stores) refuses.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "nsq-sync-test",
    "AWS_SECRET_ACCESS_KEY": "nsq-sync-test",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
}
BUCKET = "staging"


def find_gofakes3() -> Path | None:
    """The gofakes3 binary: in $NSQ_BIN, else in this checkout's .nsq/bin; None if neither."""
    root = Path(__file__).resolve().parents[2]
    for folder in (os.environ.get("NSQ_BIN"), root / ".nsq" / "bin"):
        if folder and (Path(folder) / "gofakes3").is_file():
            return Path(folder) / "gofakes3"
    return None


class S3Server:
    """gofakes3 on 127.0.0.1 (a free port), with one bucket, :data:`BUCKET`; a context manager."""

    def __init__(self, binary: Path, log: Path) -> None:
        self.binary = binary
        self.log = log
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> S3Server:
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(
                [str(self.binary), "-backend", "memory", "-initialbucket", BUCKET,
                 "-host", "127.0.0.1:0", "-quiet"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.port = wait_for(self._port, "gofakes3 to listen", timeout=30)
        return self

    def _port(self) -> int:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(f"gofakes3 exited: {self.log.read_text()}")
        for line in self.log.read_text().splitlines():
            if "using port:" in line:
                return int(line.rsplit(":", 1)[1])
        return 0

    def __exit__(self, *exc: Any) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def location(self, name: str = "") -> str:
        """A fresh ``s3://`` staging location on this server (a prefix of its own)."""
        prefix = name or f"run-{uuid.uuid4().hex[:12]}"
        return (
            f"s3://{BUCKET}/{prefix}?endpoint_override=127.0.0.1:{self.port}"
            "&scheme=http&region=us-east-1"
        )
