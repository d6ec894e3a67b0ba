"""Capture, restore and prove a host's warm caches: what `cache capture`, `deploy` and `drift`
do with a pin's cache volume.

- capture: live/ of the volume (after a served smoke, once warm-up has finished) becomes one
  artifact beside the image, keyed by what the caches are valid for (warm/key.py); a live/
  holding damaged entries is refused, nothing pushed (warm/integrity.py).
- restore: before the server starts, the artifact whose key is exactly this host's fills the
  volume: fetched with its digest checked, every file checked against its list, unpacked into
  a fresh folder, swapped in (warm/volume.py); one whose files would be damaged is refused
  before anything is written. No exact key: the nearest one and what differs,
  and a cold start, or a refusal when warm is required. A volume already holding that
  artifact is left alone; one holding anything else is replaced whole, never mixed.
- proof: after the start, each file of live/ that was not there before it is a compile, named
  by the kind of its folder (knowledge/cache_volume.yaml).
"""

from __future__ import annotations

import io
import tarfile
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from builder.engine import imageref
from builder.engine.hostprobe import HostFacts
from builder.engine.protocol import Engine
from builder.errors import OperationFailed, StackError
from builder.evidence.keys import SigningKey
from builder.evidence.oci import ArtifactStore
from builder.evidence.trust import TrustPolicy
from builder.knowledge.cache_volume import CacheVolume, cache_volume
from builder.warm import archive, artifact, integrity, ranks, signed
from builder.warm.key import (
    WarmKey,
    gpu_identity,
    model_of,
    parallel_shape,
    serve_identity,
)
from builder.warm.volume import HELPER_LABEL, FileEntry, Listing, VolumeAccess, open_volume

BASE = "base.json"
RESTORED = "restored.json"


@dataclass(frozen=True)
class WarmTarget:
    """What of a pin the warm caches depend on (built by hosts/, which knows pins)."""

    host: str
    image: str
    volume: str
    command: tuple[str, ...]
    env: dict[str, str]
    #: The GPU indices the container gets; None: all of the host's.
    gpu_indices: list[int] | None
    read_only_mounts: tuple[tuple[str, str], ...] = ()

    @property
    def image_digest(self) -> str:
        return imageref.digest_of(self.image)  # a pin names its image by digest


@dataclass
class RestoreResult:
    """What a restore did: `restored` (artifact digest) or None with why; the nearest key's
    differences where no artifact matched exactly."""

    restored: str | None
    detail: str
    differences: list[str] = field(default_factory=list)
    recovered: str | None = None

    @property
    def warm(self) -> bool:
        return self.restored is not None


@dataclass
class Proof:
    """What the server wrote into live/ since its start."""

    warm: bool
    restored: str | None
    compiled: dict[str, int]
    examples: list[str]
    rewritten: int
    #: False: no listing from just before this start (a container started by hand or by an
    #: older tool), so what it compiled cannot be told from what earlier starts did.
    known: bool = True

    @property
    def zero(self) -> bool:
        return self.known and not self.compiled and not self.rewritten

    def summary(self) -> str:
        if not self.known:
            return "unknown: no listing of the cache volume from just before this start"
        start = f"warm (restored {self.restored[:19]})" if self.restored else "cold"
        if self.zero:
            return f"{start}: nothing compiled since the start"
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.compiled.items()))
        more = f"; {self.rewritten} files rewritten" if self.rewritten else ""
        return f"{start}: compiled since the start: {kinds or 'nothing new'}{more}"

    def to_json(self) -> dict[str, Any]:
        return {
            "warm": self.warm,
            "restored": self.restored,
            "compiled": self.compiled,
            "rewritten": self.rewritten,
            "examples": self.examples,
            "known": self.known,
            "zero_compiles": self.zero,
        }


def host_key(target: WarmTarget, facts: HostFacts, access: VolumeAccess) -> WarmKey:
    names, capability, sms = gpu_identity(facts, target.gpu_indices)
    serve_hash, covers = serve_identity(target.command, target.env)
    tensor, pipeline = parallel_shape(target.command)
    model = model_of(target.command)
    return WarmKey(
        image=target.image_digest,
        gpus=names,
        sm_count=sms,
        capability=capability,
        driver=facts.driver if names else None,
        model=model,
        model_revision=access.model_revision(model),
        serve_hash=serve_hash,
        serve_covers=covers,
        tensor_parallel=tensor,
        pipeline_parallel=pipeline,
        mount=access.layout.mount,
    )


def capture(
    engine: Engine,
    store: ArtifactStore,
    target: WarmTarget,
    facts: HostFacts,
    signer: SigningKey | None = None,
) -> tuple[str, WarmKey, list[archive.CapturedFile]]:
    """Push live/ of the host's cache volume as an artifact, signed by signer where given;
    (its digest, key, files)."""
    layout = cache_volume()
    with (
        open_volume(engine, target.volume, layout, list(target.read_only_mounts)) as access,
        tempfile.TemporaryDirectory(prefix="sm120-warm-") as scratch,
    ):
        access.recover()
        key = host_key(target, facts, access)
        if not access.listing():
            raise StackError(
                f"the cache volume {target.volume} on {target.host} holds no cache yet",
                hint="start the server and run its smoke first (`sm120-stacks deploy HOST "
                "--apply`, then `sm120-stacks smoke STACK --url URL`)",
            )
        tar = Path(scratch) / "cache.tar"
        files = archive.repack(access.read_live(), layout.live, tar, layout)
        damaged = integrity.inspect_tar(tar, layout)  # exactly what would be pushed
        if damaged:
            raise integrity.refused_capture(damaged, target.host, target.volume, target.image)
        statement = (
            None if signer is None else signed.envelope(key, files, tar, target.host, signer)
        )
        pushed = artifact.push(store, key, files, tar, target.host, statement)
    return pushed.digest, key, files


def restore(
    engine: Engine,
    store: ArtifactStore,
    target: WarmTarget,
    facts: HostFacts,
    *,
    require_warm: bool = False,
    trust: TrustPolicy | None = None,
) -> RestoreResult:
    """Fill the host's cache volume from the artifact of exactly its key (see the module);
    with a trust policy, only from one a key trusted for `warm` on its GPU kind signed, checked
    before anything is fetched into the volume (warm/signed.py)."""
    tensor, pipeline = parallel_shape(target.command)
    if facts.gpu_error is None or target.gpu_indices == []:  # the count is known: judge it
        gpus = len(gpu_identity(facts, target.gpu_indices)[0])
        ranks.require_gpus(target.host, tensor, pipeline, gpus)
    layout = cache_volume()
    with open_volume(engine, target.volume, layout, list(target.read_only_mounts)) as access:
        recovered = access.recover()
        key = host_key(target, facts, access)
        candidates = artifact.find(store, target.image_digest)
        purged = _purge_unvouched(engine, access, target, store, candidates, trust)
        said = partial(_noted, purged=purged, verified=trust is not None)
        exact = [c for c in candidates if c.key == key]
        if not exact:
            result = _no_match(key, candidates)
            result.recovered = recovered
            if require_warm:
                raise _warm_required(target, result)
            return said(_cold(access, result))
        refused: list[str] = []
        signed_files: dict[str, list[archive.CapturedFile]] = {}
        if trust is not None:
            accepted, refused = signed.vouched(store, exact, trust)
            exact = [v.found for v in accepted]
            signed_files = {v.found.descriptor.digest: v.files for v in accepted}
            if not exact:
                return said(_all_refused(access, target, refused, recovered, require_warm))
        already = str((access.state(RESTORED) or {}).get("artifact"))
        if any(found.descriptor.digest == already for found in exact):
            _write_base(access)
            done = RestoreResult(already, f"the volume already holds warm cache {already[:19]}")
            done.recovered = recovered
            return said(done)
        _refuse_in_use(engine, target)
        for found in exact:
            try:
                files = signed_files.get(found.descriptor.digest)
                done = _restore_one(access, store, target, key, found, files)
            except StackError as exc:
                # Not intact (tampered, truncated): nothing of it was swapped in. An older
                # artifact of the same key may be whole; with none, the start is cold.
                refused.append(f"{found.descriptor.digest[:19]}: {exc.message}")
                continue
            done.recovered, done.differences = recovered, refused
            return said(done)
        return said(_all_refused(access, target, refused, recovered, require_warm))


def live_refusal(
    engine: Engine, store: ArtifactStore, target: WarmTarget, trust: TrustPolicy
) -> str | None:
    """Why live/ of the host's volume must not stay under trust: the warm cache an earlier
    restore left there (restored.json), which the policy does not vouch for now; None where
    it may (nothing restored, or restored from what the policy trusts). Reads only."""
    with open_volume(engine, target.volume, cache_volume()) as access:
        restored = access.state(RESTORED)
    if restored is None:
        return None
    candidates = artifact.find(store, target.image_digest)
    return signed.restored_refusal(store, candidates, restored, trust)


def purge_refused(
    engine: Engine, store: ArtifactStore, target: WarmTarget, trust: TrustPolicy
) -> str | None:
    """A cold start (`deploy --cold`) under a policy: live/ emptied where it holds what the
    policy refuses, as a restore would first; what was done."""
    with open_volume(engine, target.volume, cache_volume()) as access:
        access.recover()
        candidates = artifact.find(store, target.image_digest)
        purged = _purge_unvouched(engine, access, target, store, candidates, trust)
        _write_base(access)
    return purged


def _noted(result: RestoreResult, purged: str | None, verified: bool) -> RestoreResult:
    """What the restore did, with what the policy made it do (or that there was none)."""
    if purged is not None:
        result.detail = f"{purged}\n{result.detail}"
    if not verified and result.restored is not None:
        result.detail += f"; {UNVERIFIED}"
    return result


#: What a restore says on a host whose hosts folder has no trust policy.
UNVERIFIED = (
    "no trust policy (trust.yaml): its signature was not checked, and an unsigned warm cache "
    "is restored as a signed one is"
)


def _purge_unvouched(
    engine: Engine,
    access: VolumeAccess,
    target: WarmTarget,
    store: ArtifactStore,
    candidates: list[artifact.Found],
    trust: TrustPolicy | None,
) -> str | None:
    """Under a policy, live/ holding what an earlier restore left (restored before the
    policy, or unsigned) that the policy does not vouch for now is emptied before anything
    else, so neither a cold start nor a restore that fails runs its code; what was done."""
    restored = access.state(RESTORED)
    if trust is None or restored is None:
        return None
    why = signed.restored_refusal(store, candidates, restored, trust)
    if why is None:
        return None
    _refuse_in_use(engine, target)
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    empty.seek(0)
    access.swap_in(access.stage(uuid.uuid4().hex[:12], empty), {})
    access.clear_restored()
    return f"emptied the cache volume: it held what the trust policy refuses ({why})"


def _all_refused(
    access: VolumeAccess,
    target: WarmTarget,
    refused: list[str],
    recovered: str | None,
    require_warm: bool,
) -> RestoreResult:
    """Every artifact of the host's key was refused (not intact, or not signed by a key the
    trust policy names): nothing was written into live/; a cold start, or the refusal."""
    if require_warm:
        raise StackError(
            f"{target.host}: warm required, and every artifact of its key was refused:\n  "
            + "\n  ".join(refused),
            hint="capture it again from a warm host (`sm120-stacks cache capture HOST`, with "
            "a signing key the trust policy names for warm caches of this GPU kind)",
        )
    result = RestoreResult(None, "every warm cache of this key was refused: a cold start", refused)
    result.recovered = recovered
    return _cold(access, result)


def _restore_one(
    access: VolumeAccess,
    store: ArtifactStore,
    target: WarmTarget,
    key: WarmKey,
    found: artifact.Found,
    signed_files: list[archive.CapturedFile] | None = None,
) -> RestoreResult:
    """signed_files: the file list a trusted key signed, held to instead of files.json."""
    digest = found.descriptor.digest
    files = signed_files if signed_files is not None else artifact.files_of(store, found)
    with tempfile.TemporaryDirectory(prefix="sm120-warm-") as scratch:
        tar = Path(scratch) / "cache.tar"
        store.blob_to_file(found.layers[2], tar)
        archive.check(tar, files)
        damaged = integrity.inspect_tar(tar)  # before anything is written into the volume
        if damaged:
            raise integrity.refused_restore(damaged)
        with tar.open("rb") as stream:
            folder = access.stage(uuid.uuid4().hex[:12], stream)
    staged = access.listing(folder)
    listed = {f.path: f for f in files}
    if set(staged) != set(listed) or any(staged[p].size != listed[p].size for p in listed):
        raise OperationFailed(
            f"the restore into {target.volume} did not land whole ({len(staged)} of "
            f"{len(listed)} files): nothing was swapped in",
        )
    held = ranks.held_ranks(f.path for f in files)
    access.swap_in(
        folder,
        {
            "artifact": digest,
            "key": key.digest(),
            "files": len(files),
            "ranks": [r.folder for r in held],
        },
    )
    _write_base(access)
    size = sum(f.size for f in files)
    missing = ranks.missing_ranks(key.tensor_parallel, key.pipeline_parallel, held)
    lacking = f"; it lacks {', '.join(missing)}: those workers compile" if missing else ""
    held_text = f", ranks {' '.join(r.folder for r in held)}" if held else ""
    return RestoreResult(
        digest,
        f"restored warm cache {digest[:19]} ({len(files)} files, {size / 1e6:.1f} MB"
        f"{held_text}, captured on {found.captured_on}){lacking}",
    )


def _refuse_in_use(engine: Engine, target: WarmTarget) -> None:
    """A restore swaps live/ whole: never under a server that runs on it (two pins of one
    stack on one engine share the default volume)."""
    running = [
        c.name
        for c in engine.containers(volume=target.volume)
        if (c.attrs.get("State") or {}).get("Running")
        and HELPER_LABEL not in ((c.attrs.get("Config") or {}).get("Labels") or {})
    ]
    if running:
        raise StackError(
            f"the cache volume {target.volume} is in use by {', '.join(sorted(running))}: a "
            "restore would swap the caches of a running server",
            key="volumes",
            hint="stop it first, or give each pin its own cache volume (pin with --volume "
            f"NAME:{cache_volume().mount})",
        )


def _cold(access: VolumeAccess, result: RestoreResult) -> RestoreResult:
    access.clear_restored()
    _write_base(access)
    return result


def prove(engine: Engine, target: WarmTarget) -> Proof:
    """Compare live/ now with its listing just before the start (see the module)."""
    layout = cache_volume()
    with open_volume(engine, target.volume, layout) as access:
        base = access.state(BASE)
        restored = access.state(RESTORED)
        now = access.listing()
    return compare(layout, _listing_of(base), now, restored)


def compare(
    layout: CacheVolume, before: Listing | None, now: Listing, restored: dict[str, Any] | None
) -> Proof:
    known = before is not None
    before = before or {}
    new = sorted(path for path in now if path not in before)
    rewritten = sum(
        1
        for path, entry in now.items()
        if path in before and (entry.size, entry.mtime) != (before[path].size, before[path].mtime)
    )
    kinds = Counter(layout.kind_of(path) for path in new)
    return Proof(
        warm=restored is not None,
        restored=str(restored["artifact"]) if restored else None,
        compiled=dict(kinds),
        examples=new[:5],
        rewritten=rewritten,
        known=known,
    )


def _write_base(access: VolumeAccess) -> None:
    """The listing of live/ just before the start: what the proof compares with."""
    listing = access.listing()
    access.write_state(
        BASE, {"files": {p: [e.size, e.mtime, e.mode] for p, e in sorted(listing.items())}}
    )


def _listing_of(state: dict[str, Any] | None) -> Listing | None:
    if state is None:
        return None
    return {path: FileEntry(*values) for path, values in (state.get("files") or {}).items()}


def _warm_required(target: WarmTarget, result: RestoreResult) -> OperationFailed:
    """deploy --require-warm where no artifact has the host's key: why, and what to do."""
    return OperationFailed(
        f"{target.host}: warm required, and {result.detail.replace(': a cold start', '')}"
        + "".join(f"\n  {line}" for line in result.differences)
        + "\n  capture a cache on a host of this GPU kind, driver and pin "
        "(`sm120-stacks cache capture HOST`), or deploy without --require-warm"
    )


def _no_match(key: WarmKey, candidates: list[artifact.Found]) -> RestoreResult:
    if not candidates:
        return RestoreResult(None, "no warm cache in the registry for this image: a cold start")
    nearest = min(candidates, key=lambda c: len(key.differences(c.key)))
    differences = key.differences(nearest.key)
    return RestoreResult(
        None,
        f"no warm cache matches this host's key; the nearest ({nearest.descriptor.digest[:19]}, "
        f"captured on {nearest.captured_on}) differs in {len(differences)}: a cold start",
        differences,
    )
