"""sha256 of large context files, remembered by path and fingerprint (files.fingerprint).

A stack's context may copy a local wheel of hundreds of MB (ci-mini's CPU torch: 190 MB). Its
bytes name the image, but reading them on every `build` that has nothing to do cost a second;
a file whose size, mtime and inode are unchanged keeps its digest (the trade make and rsync
make).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from builder.files import fingerprint as file_fingerprint
from builder.files import write_atomic

CHUNK = 1 << 20


class DigestCache:
    """Digests of files, kept in one small JSON file (or only in memory, with no path)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._entries: dict[str, list[object]] = {}
        self._changed = False
        if path is not None and path.is_file():
            try:
                loaded = json.loads(path.read_text())
            except (OSError, ValueError):
                loaded = {}  # a damaged cache costs one re-hash, never a wrong digest
            if isinstance(loaded, dict):
                self._entries = {k: v for k, v in loaded.items() if _valid(v)}

    def sha256(self, file: Path) -> str:
        facts = file_fingerprint(file)
        key = str(file.resolve())
        entry = self._entries.get(key)
        if entry is not None and entry[0] == facts:
            return str(entry[1])
        digest = hashlib.sha256()
        with file.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
        self._entries[key] = [facts, digest.hexdigest()]
        self._changed = True
        return digest.hexdigest()

    def save(self) -> None:
        if self.path is not None and self._changed:
            write_atomic(self.path, json.dumps(self._entries, sort_keys=True) + "\n")
            self._changed = False


def _valid(entry: object) -> bool:
    """[fingerprint, sha256]; an entry of the older [size, mtime, sha256] form is dropped."""
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], str)
        and len(entry[1]) == 64
    )
