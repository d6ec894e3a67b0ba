"""Files written whole or not at all (a reader never sees half a lock, pin, record or report),
and the one way the tool tells that a file changed without reading it (every memo keys on it)."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write a file so readers see the old or the new content, never a half-written one.

    The temporary file beside it is named by this run (host:pid@boot), and a write removes
    the ones of the same file that dead runs left: a run SIGKILLed between the two steps
    leaves it behind, and nothing else would ever remove it (bench/results/kill-sweep/state/:
    `pull` killed while writing build/cache/digests.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}."
    _reap_dead_temporaries(path.parent, prefix)
    fd, tmp = tempfile.mkstemp(prefix=f"{prefix}{_run_label()}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _run_label() -> str:
    """This run: host:pid@boot (as engine/owner.py's owner(), which this floor cannot import)."""
    return f"{socket.gethostname()}:{os.getpid()}@{_boot_id()}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:16]
    except OSError:
        return ""


def _reap_dead_temporaries(folder: Path, prefix: str) -> None:
    """Remove folder/PREFIX HOST:PID@BOOT.XXXXXXXX files whose run is over: a process of
    this host that no longer exists in this boot, or any of an earlier boot. Never another
    host's, a live run's, or one named otherwise."""
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return
    for candidate in candidates:
        label = candidate.name[len(prefix) :].rpartition(".")[0]
        host, _, rest = label.rpartition(":")
        pid, _, boot = rest.partition("@")
        if host != socket.gethostname() or not pid.isdigit() or not boot:
            continue
        if boot == _boot_id():
            try:
                os.kill(int(pid), 0)
                continue  # alive
            except ProcessLookupError:
                pass
            except (PermissionError, OverflowError, ValueError):
                continue
        if candidate.is_file() and not candidate.is_symlink():
            with contextlib.suppress(OSError):
                candidate.unlink()


def fingerprint(path: str | os.PathLike[str]) -> str:
    """What says a file changed without reading it: its size, mtime (ns) and inode, or
    `missing`. The inode catches a file replaced by rename within the mtime's granularity."""
    try:
        stat = os.stat(path)
    except OSError:
        return "missing"
    return f"{stat.st_size} {stat.st_mtime_ns} {stat.st_ino}"


def memo_path(build_dir: Path, name: str) -> Path:
    """Where a build folder keeps a memo (answers worth remembering, never needed for
    correctness: each is keyed on what decides it, and a damaged one is recomputed)."""
    return build_dir / "cache" / name


def _mode_for(path: Path) -> int:
    """The file keeps its mode; a new one gets what open() would give it (0666 less the umask),
    not mkstemp's 0600, which would hide manifests, locks and pins from other users."""
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
