"""Find the ``nsqd`` and ``nsqlookupd`` executables the test servers run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_NSQ_BIN_ENV = "NSQ_BIN"
_LOCAL_BIN = Path(".nsq") / "bin"


class NsqBinaryNotFound(FileNotFoundError):
    """An NSQ executable could not be found: run ``scripts/build-nsq`` or set ``NSQ_BIN``."""


def find_nsq_binary(name: str) -> str:
    """Return the absolute path of the NSQ executable ``name``, e.g. ``"nsqd"``.

    Looks in the ``NSQ_BIN`` folder, the nearest ``.nsq/bin`` above the current directory (where
    ``scripts/build-nsq`` puts them), the nearest one above this package, then on ``PATH``.

    Raises:
        NsqBinaryNotFound: None of the places holds an executable of that name.
    """
    searched: list[str] = []
    env_dir = os.environ.get(_NSQ_BIN_ENV)
    candidates: list[Path] = []
    if env_dir:
        candidates.append(Path(env_dir) / name)
        searched.append(f"${_NSQ_BIN_ENV} ({env_dir})")
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            candidates.append(folder / _LOCAL_BIN / name)
        searched.append(f".nsq/bin above {start}")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate.resolve())
    on_path = shutil.which(name)
    if on_path:
        return os.path.abspath(on_path)
    searched.append("PATH")
    raise NsqBinaryNotFound(
        f"{name} executable not found (looked in {', '.join(searched)}). "
        "Run scripts/build-nsq to build nsqd and nsqlookupd v1.3.0 into .nsq/bin, "
        f"or set {_NSQ_BIN_ENV} to a folder that holds them."
    )
