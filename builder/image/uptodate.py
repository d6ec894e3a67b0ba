"""`build STACK` with nothing to do, decided from file metadata alone, as make decides.

Resolving, checking and rendering a stack needs pydantic, Jinja and every knowledge file: about
0.3 s before the engine is even asked, against BuildKit's 0.07 s for an all-cached build. After
each build the tool remembers, per stack, the size and mtime of every file that can change the
image's content hash (stacks, knowledge, templates, patches, the tool's own code, local wheels)
with the hash they gave. When none moved and the engine still has that image, with its bases
where they were, the build is a no-op: only the moving tag is set. Any doubt (a file moved, an
option given, an error of any kind) falls back to the full path, which decides for itself.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from builder import REPO_ROOT
from builder.engine import imageref
from builder.engine.socket_api import SocketApi
from builder.errors import EngineError
from builder.files import fingerprint as file_fingerprint
from builder.files import memo_path as memo_file
from builder.files import write_atomic

#: Folders of the repository whose files can change a content hash.
INPUT_DIRS = ("knowledge", "templates", "patches", "builder")
#: Environment that changes what a command resolves or which engine it asks.
INPUT_ENV = ("SM120_STACKS_BASE_SUBSTITUTE", "DOCKER_HOST")
SCHEMA = 1


def uptodate_memo(build_dir: Path, stack: str) -> Path:
    return memo_file(build_dir, f"up-to-date/{stack}.json")


def fingerprint(stacks_dir: Path, extra_files: Iterable[str]) -> str:
    """sha256 over the path, size and mtime of every input file, and the input environment."""
    digest = hashlib.sha256()
    for name in INPUT_ENV:
        digest.update(f"{name}={os.environ.get(name, '')}\0".encode())
    roots = [stacks_dir.resolve(), *(REPO_ROOT / d for d in INPUT_DIRS)]
    files: list[str] = list(extra_files)
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [os.path.join(folder, n) for n in names if not n.endswith(".pyc")]
    for file in sorted(files):
        digest.update(f"{file}\0{file_fingerprint(file)}\0".encode())
    return digest.hexdigest()


def remember(
    build_dir: Path,
    stacks_dir: Path,
    stack: str,
    wheels: dict[str, str],
    content_hash: str,
    image_ref: str,
    image_id: str,
    moving_ref: str,
    taken: str,
) -> None:
    """Record a build's outcome. `taken` is the fingerprint (without wheels) from before the
    command resolved anything, `wheels` each local wheel's files.fingerprint when it was
    hashed: if any input moved meanwhile, nothing is recorded and the next build decides in
    full."""
    if fingerprint(stacks_dir, []) != taken:
        return
    if any(file_fingerprint(wheel) != seen for wheel, seen in wheels.items()):
        return
    memo = {
        "schema": SCHEMA,
        "fingerprint": fingerprint(stacks_dir, sorted(wheels)),
        "wheels": sorted(wheels),
        "content_hash": content_hash,
        "image_ref": image_ref,
        "image_id": image_id,
        "moving_ref": moving_ref,
    }
    write_atomic(uptodate_memo(build_dir, stack), json.dumps(memo, sort_keys=True) + "\n")


def still_built(build_dir: Path, stacks_dir: Path, stack: str, socket_path: str) -> str | None:
    """The image ref when nothing changed since the last build and the engine still has the
    image with its bases unmoved (the moving tag is set again); None to take the full path."""
    try:
        memo = json.loads(uptodate_memo(build_dir, stack).read_text())
        if memo.get("schema") != SCHEMA:
            return None
        if fingerprint(stacks_dir, memo["wheels"]) != memo["fingerprint"]:
            return None
        api = SocketApi(socket_path)
        image = api.image(memo["image_ref"])
        if image is None or image.id != memo["image_id"]:
            return None
        if image.labels.get("sm120-stacks.content-hash") != memo["content_hash"]:
            return None
        for base, recorded in json.loads(image.labels.get("sm120-stacks.base-ids", "{}")).items():
            current = api.image(base)
            if current is not None and current.id != recorded:
                return None
        moving = imageref.parse(memo["moving_ref"])
        api.tag(image.id, moving.repository, moving.tag or "latest")
        return str(memo["image_ref"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EngineError):
        return None  # a damaged memo or an engine error: the full path decides and reports it
