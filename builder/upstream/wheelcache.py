"""Release wheels downloaded once into build/wheels, checked against the index's sha256.

vLLM's wheels are hundreds of MB: each is fetched once (to NAME.part, renamed when its hash
matched), said with progress on stderr, and read from the cache after that. A release the
stack's indexes lack, or a file that is not a zip, is a StackError naming it (exit 2).
"""

from __future__ import annotations

import hashlib
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.errors import StackError
from builder.upstream.index import IndexClient
from builder.upstream.metadata import Target, choose_wheel

CHUNK = 1024 * 1024
#: A download larger than this says how far it got.
PROGRESS_OVER = 16 * CHUNK


@dataclass(frozen=True)
class CachedWheel:
    """One release's wheel on disk."""

    name: str
    version: Version
    path: Path
    url: str


def release_wheel(
    client: IndexClient,
    indexes: list[str],
    name: str,
    version: str,
    target: Target,
    cache_dir: Path,
) -> CachedWheel:
    """The wheel of NAME==VERSION for the target from the first index that has it."""
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise StackError(f"{name}=={version}: not a version", key="RELEASE") from None
    newest: list[Version] = []
    for project in client.projects(indexes, name):
        files = project.releases().get(wanted, [])
        wheel = choose_wheel(files, target)
        if wheel is None:
            newest += project.available()[-1:]
            continue
        path = cache_dir / wheel.filename
        sha256 = wheel.hashes.get("sha256")
        if not (path.is_file() and (sha256 is None or _sha256(path) == sha256)):
            _download(client, project.index, wheel.url, path, sha256)
        _check_zip(path)
        return CachedWheel(name, wanted, path, wheel.url)
    said = f" (newest: {max(newest)})" if newest else ""
    raise StackError(
        f"{name} {version} has no wheel for {target.platform} on {', '.join(indexes)}{said}",
        key="RELEASE",
        hint="name a release the stack's indexes hold (sm120-stacks outdated STACK lists them)",
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _download(client: IndexClient, index: str, url: str, path: Path, sha256: str | None) -> None:
    """Stream url to path.part, then rename it once its sha256 matched the index's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    response = client.get(index, url)
    if response.status_code != 200:
        raise StackError(f"{url}: the index answered HTTP {response.status_code}", key="RELEASE")
    total = int(response.headers.get("Content-Length") or 0)
    digest, done, said, started = hashlib.sha256(), 0, 0, time.monotonic()
    try:
        with part.open("wb") as handle:
            for block in response.iter_content(CHUNK):
                handle.write(block)
                digest.update(block)
                done += len(block)
                if total > PROGRESS_OVER and done * 10 // total > said:
                    said = done * 10 // total
                    seconds = time.monotonic() - started
                    print(
                        f"downloading {path.name}: {done >> 20} of {total >> 20} MiB"
                        f" ({seconds:.0f} s)",
                        file=sys.stderr,
                    )
        if sha256 is not None and digest.hexdigest() != sha256:
            raise StackError(f"{url}: sha256 {digest.hexdigest()} is not the index's {sha256}")
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)


def _check_zip(path: Path) -> None:
    if not zipfile.is_zipfile(path):
        raise StackError(f"{path}: not a wheel (not a zip file)", key="RELEASE")
