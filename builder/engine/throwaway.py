"""Run a command in a throwaway container of an image, and read what it printed.

`test` reads an image from inside it several times (the JIT table's module verification, the
kernel-cache listing before the smoke, the device-code scan) and `push` lists its contents for
the SBOM: each a short-lived container with no network, whose stdout is the answer (a program
that prints a JSON line last). They are all started here, so each one carries its run's owner
label (owner.py): a run killed while one runs leaves a container that the next run's reaper
removes once it has stopped, and every throwaway reaps first.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from builder.engine.owner import owned, reap_orphans
from builder.engine.protocol import ContainerSpec, Engine
from builder.errors import EngineError

#: How much of a failed command's stderr (or of output without a result) an error quotes.
TAIL_CHARS = 300


class ThrowawayFailed(EngineError):
    """The throwaway's command ran but gave no answer: a non-zero exit, or no JSON line."""


@dataclass(frozen=True)
class Finished:
    """A throwaway's command, ended: its exit status and what it printed."""

    status: int
    stdout: str
    stderr: str

    def checked(self) -> Finished:
        """Itself when the command exited 0; ThrowawayFailed (with its stderr's tail) if not."""
        if self.status != 0:
            raise ThrowawayFailed(f"exit status {self.status}: {self.stderr[-TAIL_CHARS:]!r}")
        return self

    def last_json(self) -> dict[str, Any]:
        """The command's result: the last JSON line of its stdout (json_result)."""
        return json_result(self.stdout)


def json_result(output: str) -> dict[str, Any]:
    """The last line of output that is a JSON object: a command's result (what it printed
    before is progress, or rows of its own); ThrowawayFailed when there is none."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if not lines:
        raise ThrowawayFailed(f"no JSON result in the output: {output[-TAIL_CHARS:]!r}")
    try:
        return dict(json.loads(lines[-1]))
    except ValueError as exc:
        raise ThrowawayFailed(f"its last JSON line does not parse: {exc}") from None


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)  # never into a command's --json report on stdout


def run_throwaway(
    engine: Engine,
    image: str,
    argv: list[str],
    *,
    timeout_s: float,
    log: Callable[[str], None] = _to_stderr,
) -> Finished:
    """argv run to its end in a fresh container of image (no network, owner-labelled), the
    container removed after. What a dead run left behind is reaped first (log says what). An
    engine that fails to start, wait for or read it raises EngineError; a removal that fails
    is left to the next run's reaper."""
    reap_orphans(engine, log)
    container = engine.run(
        owned(ContainerSpec(image=image, command=tuple(argv), network_mode="none"))
    )
    try:
        status = container.wait(timeout=timeout_s)
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        failed = b"" if status == 0 else container.logs(stdout=False, stderr=True)
        stderr = failed.decode(errors="replace")
    finally:
        with contextlib.suppress(EngineError):  # gone already, or the reaper's later
            container.remove(force=True)
    return Finished(status, stdout, stderr)


def read_json(engine: Engine, image: str, argv: list[str], *, timeout_s: float) -> dict[str, Any]:
    """The JSON result of argv in a throwaway container of image: its last JSON line, the
    command having exited 0 (ThrowawayFailed otherwise)."""
    return run_throwaway(engine, image, argv, timeout_s=timeout_s).checked().last_json()


__all__ = ["Finished", "ThrowawayFailed", "json_result", "read_json", "run_throwaway"]
