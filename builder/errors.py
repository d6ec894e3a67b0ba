"""User-facing errors: every bad input ends as one of these, printed without a traceback.

An error names where the problem is (file, key path, line) and what to do about it, because the
person reading it is editing a manifest, not debugging this tool.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: Exit status for bad input, as documented in the README.
EXIT_BAD_INPUT = 2


@dataclass
class StackError(Exception):
    """A problem the user can fix in their input (manifest, option, environment)."""

    message: str
    file: Path | None = None
    key: str | None = None
    line: int | None = None
    hint: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = _display_path(self.file)
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        key = f"{self.key}: " if self.key else ""
        text = f"{where}{key}{self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class OperationFailed(Exception):
    """The input was fine and the operation ran, but failed (a build step, a registry refusal):
    exit status 1, with where to look. Apart from StackError so scripts can tell the two apart."""


class ToolMissing(StackError):
    """Something the machine lacks (engine, registry, GPU); the hint says how to get it."""


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
