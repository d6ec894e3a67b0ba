"""A reader that leaves (`sm120-stacks list | head -1`, a `show` piped into a closed reader)
ends the command quietly with 141, the status the shell gives `git log | head -1`: never a
traceback, never a silent 1 (issue 34). Real pipes and the installed entry point: the fault is
in the process's stdout, which CliRunner replaces."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.cli.main import EXIT_READER_GONE

ROOT = Path(__file__).resolve().parent.parent
STACKS = ROOT / "stacks"
TOOL = [sys.executable, "-m", "builder"]


def _into_a_closed_pipe(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the tool with stdout a pipe whose reading end is already closed."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(
            [*TOOL, "--stacks-dir", str(STACKS), "--build-dir", str(tmp_path / "build"), *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
    finally:
        os.close(writer)


@pytest.mark.parametrize(
    "args",
    [["list"], ["show", "ci-mini"], ["--help"]],
    ids=["list-table", "show-json", "help"],
)
def test_a_closed_reader_ends_the_command_quietly_with_141(args: list[str], tmp_path: Path) -> None:
    ran = _into_a_closed_pipe(args, tmp_path)
    assert ran.returncode == EXIT_READER_GONE == 141, ran.stderr.decode()
    assert ran.stderr == b"", "no traceback, no 'Exception ignored', no message"


def test_the_kept_listing_into_a_closed_reader_too(tmp_path: Path) -> None:
    """The second `list` is answered from the first's memo before click runs (main.py)."""
    first = subprocess.run(
        [*TOOL, "--stacks-dir", str(STACKS), "--build-dir", str(tmp_path / "build"), "list"],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    assert first.stdout
    ran = _into_a_closed_pipe(["list"], tmp_path)
    assert (ran.returncode, ran.stderr) == (EXIT_READER_GONE, b"")


def test_list_into_head_in_a_pipefail_shell(tmp_path: Path) -> None:
    """What a user types: `head -1` reads one line and leaves. The tool ends with 0 (all it
    printed fit the pipe before head left) or 141, and says nothing on stderr."""
    line = (
        f"set -o pipefail; {sys.executable} -m builder --stacks-dir {STACKS} "
        f"--build-dir {tmp_path / 'build'} list | head -c 1 >/dev/null"
    )
    ran = subprocess.run(
        ["bash", "-c", line], capture_output=True, cwd=ROOT, timeout=120, check=False
    )
    assert ran.returncode in (0, EXIT_READER_GONE), ran.stderr.decode()
    assert ran.stderr == b""


def test_a_reader_that_stays_sees_everything_and_status_0(tmp_path: Path) -> None:
    """The guard must not change a normal run: whole output, status 0."""
    ran = subprocess.run(
        [*TOOL, "--stacks-dir", str(STACKS), "--build-dir", str(tmp_path / "b"), "show", "ci-mini"],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0 and ran.stdout.rstrip().endswith(b"}"), ran.stderr.decode()
