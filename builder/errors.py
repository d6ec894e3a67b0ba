"""User-facing errors: every bad input ends as one of these, printed without a traceback.

An error names where the problem is (file, key path, line) and what to do about it, because the
person reading it is editing a manifest, not debugging this tool. The engine's errors live here
too, below every step, so any step catches them by type (`lock` asks the engine for base
digests, though the engine adapter is a later step).
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


class EngineError(Exception):
    """The engine refused or failed an operation.

    `explanation` is the daemon's message alone (a registry failure it relays, a refused
    container), without the HTTP wrapping of its API, so it can be shown and classified.
    """

    def __init__(
        self, explanation: str, *, status_code: int | None = None, retried: bool = False
    ) -> None:
        super().__init__(explanation)
        self.explanation = explanation
        #: The engine API's HTTP status (500 also when the daemon relays a registry's failure);
        #: named as the SDK names it, so code reading either kind of error reads the same.
        self.status_code = status_code
        #: The engine had already retried before it gave up (dockerd retries a layer upload 5
        #: times over about 50 s): asking it again only repeats that.
        self.retried = retried


class EngineNotFound(EngineError):
    """What was asked for (image, container, a registry's manifest) does not exist."""


class EngineUnreachable(EngineError):
    """The engine's own API could not be reached (socket gone, connection dropped)."""


class RegistryUnreachable(EngineError):
    """The engine answered, but the registry it was asked to talk to could not be reached at
    all (DNS, refused connection, timeout): not a refusal, and not "no such image"."""


def engine_check(engine: str | None = None) -> str:
    """The command that shows whether an engine answers: the local one's, or ADDRESS's."""
    return f"`docker -H {engine} version`" if engine else "`docker version`"


def engine_lost(why: str, again: str, engine: str | None = None) -> str:
    """The one sentence for an engine that stopped answering mid-command (stopped, restarted,
    its socket gone): what was seen, how to tell it answers again, and what to run then. Every
    command says it in these words: issue 34 reworded four copies of it three times."""
    return f"the Docker engine stopped answering: {why}; {once_it_answers(again, engine)}"


def once_it_answers(again: str, engine: str | None = None) -> str:
    """What to do once the engine answers again (engine_lost's tail, alone where the sentence
    before it is the caller's own: a build's client that lost the engine)."""
    return f"once it answers again ({engine_check(engine)}), {again}"


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
