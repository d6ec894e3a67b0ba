"""The commands a rendered systemd unit runs at start, as systemd would run them, for tests on
machines without systemd as PID 1: ExecStartPre lines in order (a `-` prefix: a failure is
ignored), then ExecStart. Quoting as the renderer writes it (builder/hosts/deploy.py's
systemd_quote): double quotes with C-like escapes, `$$` and `%%` for a literal `$` and `%`."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class UnitCommand:
    key: str
    argv: list[str]
    failure_ignored: bool


def start_commands(unit: str) -> list[UnitCommand]:
    """The unit's ExecStartPre and ExecStart commands, in the order systemd runs them."""
    joined = unit.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        key, _, value = line.partition("=")
        if key not in ("ExecStartPre", "ExecStart"):
            continue
        ignored = value.startswith("-")
        text = value[1:] if ignored else value
        argv = shlex.split(text.replace("$$", "$").replace("%%", "%"))
        commands.append(UnitCommand(key, argv, ignored))
    return commands


def start_as_systemd_would(unit: str, timeout_s: float = 300) -> subprocess.Popen[bytes]:
    """Run the pre-start commands (a failure without `-` raises, as systemd fails the start),
    then start ExecStart and return it running."""
    *pre, main = start_commands(unit)
    assert main.key == "ExecStart", main
    for command in pre:
        done = subprocess.run(command.argv, capture_output=True, timeout=timeout_s, check=False)
        if done.returncode != 0 and not command.failure_ignored:
            raise AssertionError(
                f"{command.key} failed ({done.returncode}), so systemd would not start the "
                f"unit: {shlex.join(command.argv)}\n{done.stderr.decode(errors='replace')}"
            )
    return subprocess.Popen(main.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
