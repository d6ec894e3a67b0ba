"""The egress watch (builder/verify/egress_watch.py) in real Python processes on this machine.

It is loaded as sitecustomize.py from a folder first on PYTHONPATH, as the smoke mounts it into
a container: a connect to another host, from the process itself, a spawned worker and a
subprocess, is recorded with the module that asked; loopback and Unix sockets are not; a
process that did not load it shows as "never loaded", so the check cannot pass vacuously.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from builder.verify import egress_watch
from builder.verify.egress import main, parse_events

SERVER = """
import multiprocessing, socket, subprocess, sys

def worker():
    try:
        socket.create_connection(("192.0.2.1", 9), timeout=0.2)
    except OSError:
        pass

if __name__ == "__main__":
    listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
    socket.create_connection(listener.getsockname(), timeout=1).close()
    unix = socket.socket(socket.AF_UNIX)
    try:
        unix.connect("/nonexistent.sock")
    except OSError:
        pass
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); probe.connect(("8.8.8.8", 80))
    multiprocessing.set_start_method("spawn")
    child = multiprocessing.Process(target=worker); child.start(); child.join()
    subprocess.run([sys.executable, "-c", "import socket; socket.getaddrinfo('hub.invalid', 443)"],
                   check=False, capture_output=True)
"""


def run_watched(tmp_path: Path, code: str, *flags: str) -> Path:
    watch = tmp_path / "watch"
    watch.mkdir()
    shutil.copy(egress_watch.__file__, watch / "sitecustomize.py")
    (tmp_path / "server_main.py").write_text(code)
    events = tmp_path / "events" / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(watch), egress_watch.LOG_ENV: str(events)}
    subprocess.run(
        [sys.executable, *flags, "server_main.py"], cwd=tmp_path, env=env, check=True, timeout=60
    )
    return events


def test_every_process_is_watched_and_each_outbound_attempt_named(tmp_path: Path) -> None:
    findings = parse_events(run_watched(tmp_path, SERVER).read_text())
    assert len(findings.processes) >= 3  # the server, its spawned worker, the subprocess
    seen = {(a["proto"], a["event"], a["to"], a["caller"].split(":")[0]) for a in findings.attempts}
    assert seen == {
        ("udp", "connect", "8.8.8.8:80", "__main__"),
        ("tcp", "connect", "192.0.2.1:9", "__mp_main__"),
        ("dns", "lookup", "hub.invalid", "__main__"),
    }
    assert not findings.passed
    assert "tcp connect 192.0.2.1:9 by __mp_main__:" in findings.detail()


def test_only_loopback_passes(tmp_path: Path) -> None:
    code = "import socket\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    code += "socket.create_connection(s.getsockname()).close()\n"
    events = run_watched(tmp_path, code)
    findings = parse_events(events.read_text())
    assert findings.passed and findings.detail().startswith("0 outbound attempts; 1 Python")
    assert main([str(events)]) == 0


def test_a_watch_that_never_loaded_fails(tmp_path: Path) -> None:
    events = run_watched(tmp_path, "print('isolated')\n", "-I")  # -I ignores PYTHONPATH
    assert not events.exists()
    findings = parse_events("")
    assert not findings.passed and "never loaded" in findings.detail()
    assert main([str(events)]) == 1
