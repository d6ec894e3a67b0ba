"""A write killed between its temporary file and the rename leaves the temporary file, and the
next write of that file removes it (issue 34, state slice: bench/kill_state.py's pull t0.80
point left build/cache/.digests.json.XXXXXXXX after the next pull, for good)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from builder.engine.owner import boot_id
from builder.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent

#: write_atomic as the tool calls it, stopped after the temporary file is written (os.replace
#: never returns), so the kill lands in that window for sure.
WRITER = """
import os, sys, time
from pathlib import Path
import builder.files as files
def stuck(src, dst):
    print("written", flush=True)
    time.sleep(600)
files.os.replace = stuck
files.write_atomic(Path(sys.argv[1]), "new: half\\n" * 1000)
"""


def test_the_next_write_removes_a_killed_writes_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "digests.json"
    target.write_text("{}\n")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "written"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    left = [p for p in tmp_path.iterdir() if p != target]
    assert len(left) == 1 and left[0].name.startswith(".digests.json.")
    live = tmp_path / f".digests.json.{socket.gethostname()}:{os.getpid()}@{boot_id()}.abcd1234"
    live.write_text("a live run's write in flight")

    write_atomic(target, '{"new": true}\n')

    assert target.read_text() == '{"new": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name])
