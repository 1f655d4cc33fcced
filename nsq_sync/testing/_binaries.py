"""Find the ``nsqd`` and ``nsqlookupd`` executables the test servers run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_NSQ_BIN_ENV = "NSQ_BIN"
_LOCAL_BIN = Path(".nsq") / "bin"


class NsqBinaryNotFound(FileNotFoundError):
    """An ``nsqd`` or ``nsqlookupd`` executable could not be found.

    Run ``scripts/build-nsq`` (it builds v1.3.0 into ``.nsq/bin``) or set ``NSQ_BIN`` to a folder
    that holds both executables.
    """


def find_nsq_binary(name: str) -> str:
    """Locate an NSQ executable such as ``nsqd`` or ``nsqlookupd``.

    Looks, in order, in the folder named by the ``NSQ_BIN`` environment variable, in the nearest
    ``.nsq/bin`` folder above the current directory (where ``scripts/build-nsq`` puts them), in the
    nearest ``.nsq/bin`` above this package (an editable install), and on ``PATH``.

    Args:
        name: Executable name, e.g. ``"nsqd"``.

    Returns:
        The absolute path of an executable file.

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
