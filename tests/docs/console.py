"""The shell sessions of the docs (fenced ``console`` blocks): ``$ COMMAND`` lines and the output
shown under each, run as a reader would type them (by shell.py's :class:`~shell.Shell`, with the
documented example addresses replaced by the test servers').

The output shown under a command is compared with what it printed (stdout and stderr, as a
terminal shows them):

- under ``nsq-sync``, line by line and word by word, except what differs from run to run: a
  JSON message line is compared by its body, a message ID (16 hex digits), an age (``5s``,
  ``3m05s``) and a decimal number (``2.1 s``) by their form;
- under another command (``scripts/demo``), by the shape of each line (any address, number or
  hex suffix in place of the shown ones), as the last lines of its output (a first
  ``scripts/demo`` also says what it set up before); nothing shown there: the output is not
  compared.

The exit status is 0, or 2 where the page shows ``nsq-sync ...: error: ...``, or N where the
command's comment says ``exit status N``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from shell import comment, same_shape

_VARIES = (
    re.compile(r"[0-9a-f]{16}"),  # a message ID
    re.compile(r"\d+(s|m\d\ds|h\d\dm|d\d\dh)"),  # an age (nsq-sync dead-letter list)
    re.compile(r"\d+\.\d+"),  # elapsed seconds, rates
)


@dataclass
class Command:
    """One ``$`` line of a console block and the output lines shown under it."""

    line: str  # as on the page, without "$ "
    shown: list[str] = field(default_factory=list)

    @property
    def is_nsq_sync(self) -> bool:
        words = self.line.split()
        return "nsq-sync" in words[:4]  # nsq-sync ..., seq N | nsq-sync ...

    def expected_status(self) -> int:
        said = re.search(r"\bexit status (\d+)", comment(self.line))
        if said:
            return int(said.group(1))
        refused = any(s.startswith("nsq-sync ") and ": error: " in s for s in self.shown)
        return 2 if refused else 0


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
    return commands


def _same_word(expected: str, actual: str) -> bool:
    return expected == actual or any(v.fullmatch(expected) and v.fullmatch(actual) for v in _VARIES)


def same_output(command: Command, shown: list[str], output: str, where: str) -> None:
    """Assert that ``output`` is what the page shows under ``command`` (``shown``, with the
    test's addresses in place of the documented ones)."""
    actual = output.splitlines()
    if not command.is_nsq_sync:
        if shown:
            assert len(actual) >= len(shown), f"{where}: shown {shown}, got {actual}"
            for expected, line in zip(shown, actual[len(actual) - len(shown) :]):
                assert same_shape(expected, line), f"{where}: shown {expected!r}, got {line!r}"
        return
    assert len(actual) == len(shown), f"{where}: shown {shown}, got {actual}"
    for expected, line in zip(shown, actual):
        if expected.startswith("{") and '"body"' in expected:
            assert json.loads(line)["body"] == json.loads(expected)["body"], (where, line)
        else:
            words, want = line.split(), expected.split()
            assert len(words) == len(want) and all(map(_same_word, want, words)), (where, line)
