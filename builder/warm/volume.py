"""A host's cache volume, read and written through its own engine.

The volume may be on another machine (ssh:// engines), so nothing here touches a path of this
one: a short-lived helper container of the tool's own image (warm/helper.py: never the pinned
one, whose code must not run before it passed the trust policy) mounts the volume, and files go
in and out as tar streams (`docker cp`). Its layout:

    VOLUME/live/...                 what the server reads and writes (the pin's cache variables)
    VOLUME/.sm120-stacks/base.json  the listing of live/ just before the server started
    VOLUME/.sm120-stacks/restored.json   which artifact live/ was restored from, if any
    VOLUME/.incoming-ID/            a restore being unpacked (never seen by a server)
    VOLUME/.restore-journal         a swap in progress: undone or finished before any start

A restore swaps the unpacked folder in by two renames under a journal; recover() runs first in
every operation, so a restore killed at any point leaves live/ as it was or as restored, whole.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO

from builder.engine.owner import owned
from builder.engine.protocol import Container, ContainerSpec, Engine, Mount
from builder.errors import EngineError, OperationFailed, StackError
from builder.knowledge.cache_volume import CacheVolume
from builder.warm.helper import helper_image, helper_reference

ROOT = "/w"
STATE = ".sm120-stacks"
JOURNAL = ".restore-journal"
HELPER_LABEL = "sm120-stacks.warm-volume"
HELPER_SECONDS = 3600
HELPER_PREFIX = "sm120-stacks-warm-"


@dataclass(frozen=True)
class FileEntry:
    size: int
    #: Modification time, whole seconds (tar keeps no finer).
    mtime: int
    mode: int


Listing = dict[str, FileEntry]


class VolumeAccess:
    """One helper container (of the tool's helper image) on the host's engine with the cache
    volume at /w (and the pin's read-only mounts, for the model's revision)."""

    def __init__(self, container: Container, layout: CacheVolume) -> None:
        self.container = container
        self.layout = layout

    def sh(self, script: str, what: str) -> str:
        code, output = self.container.exec(["sh", "-c", script])
        if code != 0:
            raise OperationFailed(f"{what} failed in the cache volume: {output.strip()[-400:]}")
        return output

    # -- reading --

    def listing(self, folder: str | None = None) -> Listing:
        """Every regular file below live/ (or folder, relative to the volume), as path ->
        entry, locks and temporaries left out."""
        where = f"{ROOT}/{folder or self.layout.live}"
        out = self.sh(
            f"[ -d {where} ] || exit 0; cd {where} && "
            "find . -type f -printf '%P\\t%s\\t%T@\\t%m\\n'",
            "listing the cache",
        )
        found: Listing = {}
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) != 4 or self.layout.skipped(parts[0]):
                continue
            found[parts[0]] = FileEntry(int(parts[1]), int(float(parts[2])), int(parts[3], 8))
        return found

    def read_live(self) -> Iterator[bytes]:
        """live/ as a tar stream (members under `live/`)."""
        return self.container.read_archive(f"{ROOT}/{self.layout.live}")

    def state(self, name: str) -> dict[str, Any] | None:
        out = self.sh(f"cat {ROOT}/{STATE}/{name} 2>/dev/null || true", f"reading {name}")
        try:
            data = json.loads(out) if out.strip() else None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def model_revision(self, model: str) -> str:
        """A Hugging Face snapshot's commit where the path names one, else a digest of the
        model folder's file names and sizes (cheap for 45 GB, and changes with any file)."""
        parts = model.rstrip("/").split("/")
        if "snapshots" in parts[:-1]:
            commit = parts[parts.index("snapshots") + 1]
            if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit):
                return commit
        if not model.startswith("/"):
            return "unknown (a hub id, not a folder of the host)"
        path = shlex.quote(model)
        out = self.sh(
            f"[ -d {path} ] || {{ echo missing; exit 0; }}; cd {path} && "
            "find -L . -type f -printf '%P %s\\n' | LC_ALL=C sort | sha256sum",
            "reading the model folder",
        ).split()
        if not out or out[0] == "missing":
            return "unknown (no such folder on the host)"
        return f"files:sha256:{out[0]}"

    # -- writing --

    def write_state(self, name: str, data: dict[str, Any]) -> None:
        """A state file, whole (through a tar stream: a listing outgrows a command line)."""
        payload = json.dumps(data, sort_keys=True).encode()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(f"{name}.tmp")
            info.size, info.mode = len(payload), 0o644
            tar.addfile(info, io.BytesIO(payload))
        buffer.seek(0)
        self.sh(f"mkdir -p {ROOT}/{STATE}", "making the state folder")
        self.container.write_archive(f"{ROOT}/{STATE}", buffer)
        self.sh(f"mv {ROOT}/{STATE}/{name}.tmp {ROOT}/{STATE}/{name}", f"writing {name}")

    def stage(self, restore_id: str, tar: BinaryIO) -> str:
        """Unpack tar into a fresh folder beside live/; its name below the volume."""
        folder = f".incoming-{restore_id}"
        self.sh(f"rm -rf {ROOT}/{folder} && mkdir -p {ROOT}/{folder}", "making the staging folder")
        self.container.write_archive(f"{ROOT}/{folder}", tar)
        return folder

    def swap_in(self, folder: str, restored: dict[str, Any]) -> None:
        """Make folder the live one, and restored.json say so: under the journal."""
        live, state = f"{ROOT}/{self.layout.live}", f"{ROOT}/{STATE}"
        text = shlex.quote(json.dumps(restored, sort_keys=True))
        self.sh(
            "set -e; "
            f"mkdir -p {state}; printf '%s' {text} > {state}/restored.json.next; "
            f"printf '%s' {shlex.quote(folder)} > {ROOT}/{JOURNAL}.tmp; "
            f"mv {ROOT}/{JOURNAL}.tmp {ROOT}/{JOURNAL}; "
            f"if [ -e {live} ]; then mv {live} {ROOT}/.previous-live; fi; "
            f"mv {ROOT}/{folder} {live}; "
            f"mv {state}/restored.json.next {state}/restored.json; "
            f"rm -f {ROOT}/{JOURNAL}; rm -rf {ROOT}/.previous-live",
            "swapping the restored cache in",
        )

    def recover(self) -> str | None:
        """Undo or finish a swap a killed restore left, and drop its staging folders; what was
        done, in words (None: nothing to do)."""
        live, state = f"{ROOT}/{self.layout.live}", f"{ROOT}/{STATE}"
        out = self.sh(
            f"cd {ROOT}; did=''; "
            f"if [ -f {JOURNAL} ]; then f=$(cat {JOURNAL}); "
            f'  if [ -d "$f" ]; then '
            f"    if [ ! -e {live} ] && [ -d .previous-live ]; then mv .previous-live {live}; fi; "
            "    did='undid a restore killed before its swap'; "
            f"  else [ -f {state}/restored.json.next ] && mv {state}/restored.json.next "
            f"{state}/restored.json; did='finished a restore killed after its swap'; fi; "
            f"  rm -f {JOURNAL}; fi; "
            f"rm -rf .previous-live {state}/restored.json.next {JOURNAL}.tmp; "
            'for d in .incoming-*; do [ -e "$d" ] || continue; rm -rf "$d"; '
            '[ -n "$did" ] || did=\'removed an unfinished restore\'; done; echo "$did"',
            "recovering the cache volume",
        ).strip()
        return out or None

    def clear_restored(self) -> None:
        self.sh(f"rm -f {ROOT}/{STATE}/restored.json", "clearing the restore marker")


@contextmanager
def open_volume(
    engine: Engine,
    volume: str,
    layout: CacheVolume,
    read_only_mounts: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> Iterator[VolumeAccess]:
    """A helper container of the tool's helper image (warm/helper.py, run by its image id)
    with volume at /w; removed on leaving. A helper a killed run left behind on this volume is
    removed first (at most one operation per volume)."""
    # Not engine/owner.py's reaper alone: a dead run's helper still sleeps (running, which
    # the reaper leaves), and a second operation must not share a volume with it. It carries
    # the owner label too, so the reaper removes it once it exits if no one opens the volume.
    for stale in engine.containers(label=f"{HELPER_LABEL}={volume}"):
        _remove(stale)
    spec = ContainerSpec(
        image=helper_image(engine),
        entrypoint=("sleep",),
        command=(str(HELPER_SECONDS),),
        name=f"{HELPER_PREFIX}{uuid.uuid4().hex[:12]}",
        labels={HELPER_LABEL: volume},
        mounts=(
            Mount(volume, ROOT),
            *(Mount(source, target, read_only=True) for source, target in read_only_mounts),
        ),
        network_mode="none",
        user="0:0",
    )
    try:
        container = engine.run(owned(spec))
    except EngineError as exc:
        raise StackError(
            f"cannot open the cache volume {volume} on this engine: {exc.explanation}",
            hint=f"check the engine can run the helper image ({helper_reference()})",
        ) from None
    try:
        yield VolumeAccess(container, layout)
    finally:
        _remove(container)


def _remove(container: Container) -> None:
    with contextlib.suppress(EngineError):
        container.remove(force=True)
