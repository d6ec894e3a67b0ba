"""Signed warm caches: who captured an artifact, and whether this host may run what it holds.

A warm cache is code the server loads and runs (Triton cubins, torch.compile's generated
Python and pickled graphs, CUDA driver cache entries), so an artifact that is merely intact
is not enough: anyone with push access can make a self-consistent one. `cache capture` signs
a statement about the image digest whose predicate is the artifact's key, its whole file
list with sha256s and the tar's digest (builder/evidence/signing.py); a host with a trust
policy restores only artifacts a key trusted for `warm` on its GPU kind signed, uses the
signed file list (not files.json) to check the tar, and orders them by the signed capture
time, never by the manifest's unsigned annotation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from builder.errors import StackError
from builder.evidence import signing
from builder.evidence.keys import SigningKey
from builder.evidence.oci import ArtifactStore
from builder.evidence.trust import TrustPolicy, Untrusted, vouch
from builder.warm.archive import CapturedFile
from builder.warm.artifact import Found, files_document
from builder.warm.key import WarmKey

READ_BYTES = 1 << 20
#: The GPU kind of a key with no GPU (a CPU pin), as served verdicts name it.
NO_GPU = "cpu"


def tar_digest(tar: Path) -> str:
    digest = hashlib.sha256()
    with tar.open("rb") as stream:
        while chunk := stream.read(READ_BYTES):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def envelope(
    key: WarmKey, files: list[CapturedFile], tar: Path, host: str, signer: SigningKey
) -> bytes:
    """The signed statement of one capture, about the image its key names."""
    predicate = {
        "key": key.model_dump(),
        "key_digest": key.digest(),
        **files_document(files),
        "tar": {"digest": tar_digest(tar), "size": tar.stat().st_size},
        "captured_on": host,
        "captured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    statement = signing.statement(
        "sm120-stacks-warm-cache", key.image, signing.WARM_CACHE_PREDICATE, predicate
    )
    return signing.sign(statement, signer)


@dataclass(frozen=True)
class Vouched:
    """An artifact whose capture a key trusted for this host's GPU kind signed."""

    found: Found
    files: list[CapturedFile]
    key_name: str
    captured_at: str


def gpu_kinds(key: WarmKey) -> list[str]:
    return sorted(set(key.gpus)) or [NO_GPU]


def vouched(
    store: ArtifactStore, candidates: list[Found], policy: TrustPolicy
) -> tuple[list[Vouched], list[str]]:
    """The candidates the policy lets this host restore, newest signed capture first, and a
    line per refused one (its digest, the key id and why)."""
    accepted: list[Vouched] = []
    refused: list[str] = []
    for found in candidates:
        try:
            accepted.append(_vouch_one(store, found, policy))
        except StackError as exc:  # Untrusted, or an envelope that is not one
            refused.append(f"{found.descriptor.digest[:19]}: {exc.message}")
    accepted.sort(key=lambda v: v.captured_at, reverse=True)
    return accepted, refused


def _vouch_one(store: ArtifactStore, found: Found, policy: TrustPolicy) -> Vouched:
    name = f"warm cache {found.descriptor.digest[:19]}"
    if found.envelope is None:
        raise Untrusted(f"{name}: unsigned [no key]")
    raw = store.blob(found.envelope)
    statement: dict[str, Any] = {}
    key_name = ""
    for kind in gpu_kinds(found.key):  # every GPU kind of the key must trust the signer
        checked = vouch(
            raw,
            document=name,
            predicate_type=signing.WARM_CACHE_PREDICATE,
            digest=found.key.image,
            policy=policy,
            purpose="warm",
            gpu_kind=kind,
        )
        statement, key_name = checked.statement, checked.key_name
    predicate = statement["predicate"]
    if predicate.get("key") != found.key.model_dump():
        raise Untrusted(f"{name}: its key.json is not the key that was signed [{key_name}]")
    tar = found.layers[2]
    if (predicate.get("tar") or {}).get("digest") != tar.digest:
        raise Untrusted(f"{name}: its tar is not the one that was signed [{key_name}]")
    try:
        files = [CapturedFile(**entry) for entry in predicate["files"]]
    except (KeyError, TypeError) as exc:
        raise Untrusted(f"{name}: its signed file list is malformed ({exc})") from None
    return Vouched(found, files, key_name, str(predicate.get("captured_at", "")))


def restored_refusal(
    store: ArtifactStore, candidates: list[Found], restored: dict[str, Any], policy: TrustPolicy
) -> str | None:
    """Why what a restore left in the volume (restored.json: its artifact) must not stay
    under the policy; None where it may. An artifact restored before the host had a policy
    (or restored unsigned) is still in live/, and a cold start would load it: it may stay
    only where the policy vouches for it now, as it would for a restore."""
    digest = str(restored.get("artifact") or "")
    same = [found for found in candidates if found.descriptor.digest == digest]
    if not same:
        return (
            f"warm cache {digest[:19]}: it is not in the registry any more, so no signature "
            "of it can be checked"
        )
    accepted, refused = vouched(store, same, policy)
    return None if accepted else refused[0]
