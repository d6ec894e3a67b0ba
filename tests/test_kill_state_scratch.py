"""Temporary folders of a SIGKILLed run are removed by the next run (issue 34, state slice:
bench/kill_state.py found `lock` killed midway leaving TMPDIR/sm120-lock-* for good, and
`propose` killed midway leaving .propose-NAME.* beside stacks/; neither the next lock nor the
next propose removed them, nor could tell them from a live run's)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from click.testing import Result

from builder.engine.owner import boot_id
from builder.engine.scratch import RUN_PREFIX
from tests.test_upstream import index, offline  # noqa: F401  (the fixture index and stack)

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv/bin/sm120-stacks"

#: What `lock` does (uv_compile: a TemporaryDirectory), in a process that the CLI's entry set
#: up; it says where, then waits to be killed.
HOLDER = (
    "import tempfile, time; from builder.engine.scratch import use_run_tempdir; "
    "use_run_tempdir(); d = tempfile.TemporaryDirectory(prefix='sm120-lock-'); "
    "print(d.name, flush=True); time.sleep(600)"
)


def _ended_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    return int(done.stdout)


def _label(pid: int, boot: str | None = None) -> str:
    return f"{socket.gethostname()}:{pid}@{boot_id() if boot is None else boot}"


def test_the_next_run_removes_a_killed_runs_temporary_folder(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert holder.stdout is not None
    held = Path(holder.stdout.readline().strip())
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert held.is_dir() and held.parent.name.startswith(RUN_PREFIX)
        (held / "requirements.txt").write_text("torch\n")
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        alive = tmp_path / f"{RUN_PREFIX}{_label(live.pid)}.abcd1234"
        alive.mkdir()
        earlier_boot = tmp_path / f"{RUN_PREFIX}{_label(live.pid, 'f' * 16)}.abcd1234"
        earlier_boot.mkdir()
        elsewhere = tmp_path / f"{RUN_PREFIX}other-host:{_ended_pid()}@{boot_id()}.abcd1234"
        elsewhere.mkdir()

        ran = subprocess.run([CLI, "--help"], env=env, capture_output=True, text=True, cwd=ROOT)
        assert ran.returncode == 0, ran.stderr
        assert not held.parent.exists()  # the killed run's, with what it held
        assert alive.is_dir()  # a live run's is never touched
        assert not earlier_boot.exists()  # nothing of an earlier boot lives
        assert elsewhere.is_dir()  # another host's pid means nothing here
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [alive.name, elsewhere.name]
        )  # and the next run removed its own at its exit
    finally:
        live.kill()
        live.wait()


def test_propose_removes_the_scratch_a_killed_propose_left(
    offline: Path,  # noqa: F811
    run_cli: Callable[..., Result],
) -> None:
    dead = offline.parent / f".propose-try.{_label(_ended_pid())}.abcd1234"
    dead.mkdir()
    (dead / "offline.yaml").write_text("copied: true\n")
    live = offline.parent / f".propose-try.{_label(os.getpid())}.efgh5678"
    live.mkdir()

    result = run_cli(
        "propose",
        "try",
        "--from",
        "offline",
        "--set",
        "vllm=0.33.0",
        "--no-lock",
        stacks_dir=offline,
    )
    assert result.exit_code == 0, result.output
    assert not dead.exists()
    assert [p.name for p in offline.parent.glob(".propose-*")] == [live.name]
