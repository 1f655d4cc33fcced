"""The shell sessions of the docs (fenced ``console`` blocks): ``$ nsq-sync ...`` lines and the
output shown under each, run as a reader would type them.

A command is ``nsq-sync ARGS`` (run as ``python -m nsq_sync ARGS``), optionally fed by
``seq N |``; the documented example addresses are replaced by the test servers' (``substitute``
of test_doc_snippets). Nothing else is run: a console block with another command fails
:func:`session`, so a page cannot show a command the tests skip without saying so.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

NSQ_SYNC = [sys.executable, "-m", "nsq_sync"]
_SEQ = re.compile(r"^seq (\d+) \| (nsq-sync .*)$")


@dataclass
class Command:
    """One ``$`` line of a console block and the output lines shown under it."""

    line: str  # as on the page, without "$ "
    shown: list[str] = field(default_factory=list)

    def argv(self, substitute: Callable[[str], str]) -> tuple[list[str], bytes | None]:
        """What to run and its standard input."""
        text = substitute(self.line)
        stdin = None
        seq = _SEQ.match(text)
        if seq:
            stdin = "".join(f"{i}\n" for i in range(1, int(seq.group(1)) + 1)).encode()
            text = seq.group(2)
        words = shlex.split(text)
        assert words[0] == "nsq-sync", f"not an nsq-sync command: {self.line!r}"
        return [*NSQ_SYNC, *words[1:]], stdin


def session(code: str) -> list[Command]:
    """The commands of a console block, each with the lines shown after it."""
    commands: list[Command] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            commands.append(Command(line[2:].strip()))
        elif line.strip():
            assert commands, f"output before any command: {line!r}"
            commands[-1].shown.append(line)
    assert commands, "a console block with no command"
    for command in commands:
        _, _, rest = command.line.partition("nsq-sync")
        assert rest, f"only nsq-sync commands are run: {command.line!r}"
    return commands


def run(
    command: Command, substitute: Callable[[str], str], timeout: float = 60.0
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` to its end."""
    argv, stdin = command.argv(substitute)
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)


def spawn(command: Command, substitute: Callable[[str], str]) -> subprocess.Popen[bytes]:
    """Start a long-running ``command`` (``nsq-sync tail`` until Ctrl-C)."""
    argv, _ = command.argv(substitute)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
