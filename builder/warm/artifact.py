"""Warm-cache artifacts in the registry: pushed beside the image they belong to, found by it.

One artifact per capture: an OCI artifact whose subject is the image manifest (so it is found
with the image's evidence, by the referrers API or the referrers tag), with three layers: the
key (key.json), the file list with digests (files.json) and the tar of live/. The key is read
before anything big is fetched, so finding the right artifact costs two small blobs each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from builder.errors import OperationFailed, StackError
from builder.evidence.documents import KIND_ANNOTATION, SUBJECT_ANNOTATION, WARM_CACHE_TYPE
from builder.evidence.oci import ArtifactStore, Descriptor
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE
from builder.warm.archive import CapturedFile
from builder.warm.key import WarmKey, canonical
from builder.warm.ranks import ranks_summary

KEY_TYPE = "application/vnd.sm120-stacks.warm-key.v1+json"
FILES_TYPE = "application/vnd.sm120-stacks.warm-files.v1+json"
TAR_TYPE = "application/vnd.sm120-stacks.warm-cache.v1.tar"
KEY_ANNOTATION = "dev.sm120-stacks.warm.key"
HOST_ANNOTATION = "dev.sm120-stacks.warm.captured-on"
#: The layers every artifact has; a signed one has the DSSE envelope after them.
PAYLOAD = [KEY_TYPE, FILES_TYPE, TAR_TYPE]


@dataclass(frozen=True)
class Found:
    """One warm-cache artifact of an image, its key read and checked."""

    descriptor: Descriptor
    key: WarmKey
    captured_on: str
    created: str
    #: The key, file-list and tar layers' descriptors.
    layers: tuple[Descriptor, Descriptor, Descriptor]
    #: The DSSE envelope of the capture's signed statement (warm/signed.py); None: unsigned.
    envelope: Descriptor | None = None


def push(
    store: ArtifactStore,
    key: WarmKey,
    files: list[CapturedFile],
    tar: Path,
    host: str,
    signed: bytes | None = None,
) -> Descriptor:
    """signed: the DSSE envelope of the capture (warm/signed.py), a fourth layer."""
    subject = store.image(key.image)
    scratch = tar.with_name(tar.name + ".meta")
    scratch.mkdir(exist_ok=True)
    key_file, files_file = scratch / "key.json", scratch / "files.json"
    envelope_file = scratch / "statement.dsse.json"
    key_file.write_bytes(canonical(key.model_dump()))
    files_file.write_bytes(canonical(files_document(files)))
    annotations = {
        SUBJECT_ANNOTATION: key.image,
        KIND_ANNOTATION: "warm-cache",
        KEY_ANNOTATION: key.digest(),
        HOST_ANNOTATION: host,
        "org.opencontainers.image.created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    layers = [(key_file, KEY_TYPE), (files_file, FILES_TYPE), (tar, TAR_TYPE)]
    if signed is not None:
        envelope_file.write_bytes(signed)
        layers.append((envelope_file, ENVELOPE_MEDIA_TYPE))
    try:
        return store.attach_files(subject, WARM_CACHE_TYPE, layers, annotations)
    finally:
        for scratch_file in (key_file, files_file, envelope_file):
            scratch_file.unlink(missing_ok=True)
        scratch.rmdir()


def files_document(files: list[CapturedFile]) -> dict[str, object]:
    """files.json: every file with its digest, and per rank (rank_R_D, vLLM's per-worker
    torch.compile folders) how many of them and their bytes, for a reader of the registry; a
    restore works the ranks out from the paths again (builder/warm/ranks.py)."""
    return {
        "files": [f.to_json() for f in files],
        "ranks": ranks_summary((f.path, f.size) for f in files),
    }


def find(store: ArtifactStore, image_digest: str) -> list[Found]:
    """Every warm-cache artifact of the image, newest first."""
    artifacts, _ = store.referrers(image_digest)
    found = []
    for descriptor in artifacts:
        if descriptor.artifact_type not in (None, WARM_CACHE_TYPE):
            continue
        manifest = store.manifest(descriptor)
        if manifest.get("artifactType") != WARM_CACHE_TYPE:
            continue
        if (manifest.get("subject") or {}).get("digest") != image_digest:
            raise StackError(
                f"warm-cache artifact {descriptor.digest} is listed for {image_digest} but "
                "refers to another image: refused"
            )
        layers = [Descriptor.of(layer) for layer in manifest.get("layers") or []]
        kinds = [layer.media_type for layer in layers]
        if kinds not in (PAYLOAD, [*PAYLOAD, ENVELOPE_MEDIA_TYPE]):
            raise OperationFailed(f"warm-cache artifact {descriptor.digest} has other layers")
        key = _key(store.blob(layers[0]), descriptor)
        annotations = manifest.get("annotations") or {}
        if annotations.get(KEY_ANNOTATION) not in (None, key.digest()):
            raise StackError(
                f"warm-cache artifact {descriptor.digest}: its annotated key is not its key.json"
            )
        found.append(
            Found(
                descriptor,
                key,
                str(annotations.get(HOST_ANNOTATION, "unknown")),
                str(annotations.get("org.opencontainers.image.created", "")),
                (layers[0], layers[1], layers[2]),
                layers[3] if len(layers) == 4 else None,
            )
        )
    return sorted(found, key=lambda f: f.created, reverse=True)


def files_of(store: ArtifactStore, found: Found) -> list[CapturedFile]:
    data = json.loads(store.blob(found.layers[1]))
    try:
        return [CapturedFile(**entry) for entry in data["files"]]
    except (KeyError, TypeError) as exc:
        raise StackError(
            f"warm-cache artifact {found.descriptor.digest}: its file list is malformed ({exc})"
        ) from None


def _key(payload: bytes, descriptor: Descriptor) -> WarmKey:
    try:
        return WarmKey.model_validate(json.loads(payload))
    except (ValueError, ValidationError) as exc:
        raise StackError(
            f"warm-cache artifact {descriptor.digest}: its key.json is not a key this tool reads "
            f"({str(exc).splitlines()[0]})",
            hint="capture it again with this version of sm120-stacks",
        ) from None
