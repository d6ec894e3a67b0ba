"""Temporary folders named by the run that made them, so the next run removes a dead one's.

A run ended by SIGKILL (the OOM killer, a CI runner's timeout, `kill -9`) runs no cleanup: the
TemporaryDirectory it had open (a lock's uv work folder, a capture's tar, a propose's scratch
copy of stacks/) stays for good, and its name says nothing of whose it was, so no later run can
tell it from a live run's (bench/results/kill-sweep/state/: `lock` and `propose` killed midway).
So the CLI gives each run one temporary folder of its own, named by its owner (host:pid@boot,
engine/owner.py), and every temporary file of the run goes below it (tempfile.tempdir); a
folder made in a given place (propose's scratch beside stacks/) is named the same way. Before
making its own, a run removes the folders of that kind whose owner is a dead process of this
host in this boot, or of an earlier boot of this host (nothing of it lives). A live run's
folder, or another host's (a shared /tmp), is never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import tempfile
from pathlib import Path

from builder.engine.owner import boot_id, dead_owner, owner

#: The run's own temporary folder, below the system's: TMP/sm120-stacks-run.OWNER.XXXXXXXX.
RUN_PREFIX = "sm120-stacks-run."


def owned_mkdtemp(prefix: str, parent: Path) -> Path:
    """A fresh folder parent/PREFIX OWNER.XXXXXXXX of this run, after removing the ones of that
    prefix that dead runs left there."""
    reap(prefix, parent)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owner()}.", dir=parent))


def reap(prefix: str, parent: Path) -> list[Path]:
    """Remove parent/PREFIX* folders whose owner is dead (see the module); the ones removed."""
    removed: list[Path] = []
    try:
        candidates = list(parent.glob(f"{glob_escape(prefix)}*"))
    except OSError:
        return removed
    for path in candidates:
        label = path.name[len(prefix) :].rpartition(".")[0]
        if path.is_dir() and not path.is_symlink() and _dead(label):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def use_run_tempdir() -> Path:
    """Make this process's temporary files go below a folder of its own (once per process),
    removed at its exit; a dead run's such folder is removed first."""
    current = Path(tempfile.gettempdir())
    if current.name.startswith(f"{RUN_PREFIX}{owner()}."):
        return current  # this process already has one
    mine = owned_mkdtemp(RUN_PREFIX, current)
    atexit.register(shutil.rmtree, mine, True)
    tempfile.tempdir = str(mine)
    return mine


def _dead(label: str) -> bool:
    """host:pid@boot of this host, whose process ended (this boot) or whose boot is over."""
    host, _, rest = label.rpartition(":")
    pid, _, boot = rest.partition("@")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if boot and boot_id() and boot != boot_id():
        return True
    return dead_owner(label)


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def die_with_parent() -> None:
    """subprocess's preexec_fn: the child is SIGKILLed when the tool dies (Linux). A `uv`
    that outlived a killed `lock` kept resolving into the run's temporary folder and, as uv
    makes its output file's folders, made it again after the next run had removed it."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


#: prctl(2)'s option that signals a child when its parent thread exits.
PR_SET_PDEATHSIG = 1
