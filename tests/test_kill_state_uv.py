"""A `lock` SIGKILLed while uv resolves takes uv with it (issue 34, state slice:
bench/kill_state.py's lock t0.35 point found the killed run's temporary folder back after the
next lock had removed it: the orphaned uv went on and, as uv makes its output file's folders,
wrote its answer into it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: A uv that takes a while, then writes its --output-file (making its folders, as uv does),
#: and says its pid first.
FAKE_UV = """#!{python}
import os, sys, time
out = sys.argv[sys.argv.index("--output-file") + 1]
print(os.getpid(), file=open(os.environ["FAKE_UV_PID"], "w"), flush=True)
time.sleep(3)
os.makedirs(os.path.dirname(out), exist_ok=True)
open(out, "w").write("")
"""

#: The tool's lock step (uv_compile._compile) on a stand-in stack, in a process of its own.
LOCKER = """
import sys
from pathlib import Path
from types import SimpleNamespace
from builder.lock.uv_compile import _compile
python = SimpleNamespace(version="3.11", index_url="http://127.0.0.1:9/simple",
                         extra_index_urls=[], wheels=[])
stack = SimpleNamespace(name="t", manifest=SimpleNamespace(platform="linux/amd64",
                        python=python), local_file=lambda w: w, sources=[Path("t.yaml")])
print("resolving", flush=True)
_compile(Path(sys.argv[1]), stack, Path(sys.argv[2]), "all", ["six"], [], constraints=None)
"""


def test_a_killed_lock_takes_its_uv_with_it(tmp_path: Path) -> None:
    uv = tmp_path / "uv"
    uv.write_text(FAKE_UV.format(python=sys.executable))
    uv.chmod(0o755)
    work = tmp_path / "sm120-lock-x"
    work.mkdir()
    pid_file = tmp_path / "uv.pid"
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(uv), str(work)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_UV_PID": str(pid_file)},
    )
    assert locker.stdout is not None
    assert locker.stdout.readline().strip() == "resolving"
    deadline = time.monotonic() + 10
    while not pid_file.is_file() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the fake uv never started"
        time.sleep(0.05)
    uv_pid = int(pid_file.read_text())
    locker.send_signal(signal.SIGKILL)
    locker.wait()
    shutil.rmtree(work)  # what the next run does with a dead run's folder

    time.sleep(4)  # past the fake uv's 3 s
    assert not work.exists(), "uv outlived the killed lock and wrote into its folder"
    assert (
        not Path(f"/proc/{uv_pid}").exists()
        or "Z" in Path(f"/proc/{uv_pid}/stat").read_text().split()[2]
    )
