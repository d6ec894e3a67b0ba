"""Files written whole or not at all (a reader never sees half a lock, pin, record or report),
and the one way the tool tells that a file changed without reading it (every memo keys on it)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write a file so readers see the old or the new content, never a half-written one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
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
