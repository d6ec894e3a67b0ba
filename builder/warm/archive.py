"""The warm-cache artifact's payload: one tar of live/ and the list of its files with digests.

Captured files keep their modes and mtimes (a cache whose files look newer than their sources
is rebuilt by some writers); locks and writers' temporaries are left out. Members are written in
path order with fixed owners, so one cache captured twice gives one tar. Before anything is
unpacked on a host, check() reads the tar once and holds it to the list: every member a
regular file or folder below the root, every file's sha256 and size as listed, nothing missing
and nothing extra. A tampered or truncated artifact is refused whole.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from builder.errors import StackError
from builder.knowledge.cache_volume import CacheVolume

READ_BYTES = 1 << 20


@dataclass(frozen=True)
class CapturedFile:
    path: str
    size: int
    sha256: str
    mode: int
    mtime: int
    kind: str

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "mode": self.mode,
            "mtime": self.mtime,
            "kind": self.kind,
        }


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (the engine's tar stream). Reads advance
    an offset into the current chunk: slicing it instead would copy the rest at every read."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._chunk = memoryview(b"")
        self._at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at >= len(self._chunk):
            try:
                self._chunk, self._at = memoryview(next(self._chunks)), 0
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._chunk) - self._at)
        buffer[:size] = self._chunk[self._at : self._at + size]
        self._at += size
        return size


def repack(chunks: Iterable[bytes], top: str, out: Path, layout: CacheVolume) -> list[CapturedFile]:
    """Write the engine's tar of folder `top` (members `top/...`) to out as the artifact's tar
    (members relative to top, sorted), leaving out what the layout never captures; the files
    written. Members are spooled once to a scratch tar, then written in path order."""
    spool = out.with_name(out.name + ".spool")
    members: list[tuple[str, tarfile.TarInfo, int]] = []
    try:
        with (
            tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks)), mode="r|") as source,
            spool.open("wb") as scratch,
        ):
            for member in source:
                name = _relative(member.name, top)
                if name is None or layout.skipped(name) or not (member.isfile() or member.isdir()):
                    continue
                offset = scratch.tell()
                if member.isfile():
                    handle = source.extractfile(member)
                    assert handle is not None
                    _copy(handle, scratch)
                members.append((name, member, offset))
        files = []
        with spool.open("rb") as scratch, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
            for name, member, offset in sorted(members, key=lambda item: item[0]):
                info = tarfile.TarInfo(name)
                info.mode, info.mtime = member.mode & 0o7777, int(member.mtime)
                info.type = member.type
                info.uid = info.gid = 0
                if member.isdir():
                    tar.addfile(info)
                    continue
                info.size = member.size
                scratch.seek(offset)
                digest = _HashingReader(scratch, member.size)
                tar.addfile(info, digest)  # type: ignore[arg-type]
                files.append(
                    CapturedFile(
                        name,
                        member.size,
                        digest.hexdigest(),
                        info.mode,
                        info.mtime,
                        layout.kind_of(name),
                    )
                )
        return files
    finally:
        spool.unlink(missing_ok=True)


def check(tar_path: Path, files: list[CapturedFile]) -> None:
    """Refuse a tar that is not exactly the listed files (see the module's docstring)."""
    expected = {f.path: f for f in files}
    seen: set[str] = set()
    try:
        with tarfile.open(tar_path, "r:") as tar:
            for member in tar:
                name = member.name
                if name.startswith("/") or ".." in name.split("/"):
                    raise _refused(f"member {name!r} leaves the cache folder")
                if member.isdir():
                    continue
                if not member.isfile():
                    raise _refused(f"member {name!r} is not a regular file")
                listed = expected.get(name)
                if listed is None:
                    raise _refused(f"{name} is in the tar but not in the artifact's file list")
                handle = tar.extractfile(member)
                assert handle is not None
                digest = _HashingReader(handle, member.size)
                while digest.read(READ_BYTES):
                    pass
                if member.size != listed.size or digest.hexdigest() != listed.sha256:
                    raise _refused(f"{name} does not match its listed size and sha256")
                seen.add(name)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise _refused(f"its tar cannot be read ({exc})") from None
    missing = sorted(set(expected) - seen)
    if missing:
        raise _refused(f"{len(missing)} listed files are not in its tar (first: {missing[0]})")


class _HashingReader:
    """Reads at most size bytes of a file, hashing them."""

    def __init__(self, handle: IO[bytes], size: int) -> None:
        self._handle, self._left = handle, size
        self._digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        want = self._left if size < 0 else min(size, self._left)
        data = self._handle.read(want)
        self._left -= len(data)
        self._digest.update(data)
        return data

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def _copy(handle: IO[bytes], out: IO[bytes]) -> None:
    while chunk := handle.read(READ_BYTES):
        out.write(chunk)


def _relative(name: str, top: str) -> str | None:
    name = name.removeprefix("./")
    if name == top or not name.startswith(top + "/"):
        return None
    rest = name[len(top) + 1 :].strip("/")
    return rest or None


def _refused(why: str) -> StackError:
    return StackError(
        f"the warm-cache artifact is not intact: {why}; nothing was restored",
        hint="capture it again from a warm host (`sm120-stacks cache capture HOST`)",
    )
