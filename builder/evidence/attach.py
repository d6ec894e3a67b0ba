"""Push an image's evidence beside it: the verdict document, the SBOM, the provenance.

Run by `push` once the image is in the registry (the artifacts name its manifest digest, which
only the registry knows), and by `smoke --url --record`, which adds a served verdict from a
deployed host: one host's smoke counts for every host of its GPU kind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.engine import imageref
from builder.engine.address import DEFAULT as DEFAULT_ADDRESS
from builder.engine.protocol import Engine
from builder.engine.throwaway import run_throwaway
from builder.errors import EngineError
from builder.evidence import documents
from builder.evidence.documents import (
    KIND_ANNOTATION,
    PROVENANCE_TYPE,
    SBOM_TYPE,
    SIGNER_KEY_ANNOTATION,
    SUBJECT_ANNOTATION,
    VERDICT_TYPE,
    ImageContents,
    ProvenanceInputs,
    SbomInputs,
)
from builder.evidence.index import publish_next
from builder.evidence.keys import PublicKey, SigningKey, public_pem
from builder.evidence.oci import ArtifactStore, Descriptor
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, seal
from builder.image.names import local_ref
from builder.image.records import Record, ServedVerdict
from builder.image.registry import Registry
from builder.lock.lockfile import Lock
from builder.manifest.resolve import ResolvedStack
from builder.render.context import JIT_WORKSPACE, RenderedContext

#: How each document reached the registry (registry_http: tls-verified, tls-unverified or
#: plain-http), so a reader sees where the user allowed less than verified TLS.
TRANSPORT_ANNOTATION = "dev.sm120-stacks.transport"
_SPLIT = "===sm120-stacks==="
#: One container of the image lists what it holds: dpkg's status, the precompiled modules'
#: sha256, and (for a stack without a lock) what pip has installed.
_CONTENTS_SCRIPT = (
    "cat /var/lib/dpkg/status 2>/dev/null; echo " + _SPLIT + "; "
    ". /etc/os-release 2>/dev/null; echo ${ID:-debian}; echo " + _SPLIT + "; "
    f"find {JIT_WORKSPACE} -name '*.so' -type f -exec sha256sum {{}} + 2>/dev/null; "
    "echo " + _SPLIT + "; "
    "python3 -m pip list --format=json 2>/dev/null || echo '[]'"
)


def image_contents(engine: Engine, image_ref: str) -> ImageContents | None:
    """What the image holds; None for an image that cannot run the listing (no shell in it)."""
    try:
        out = run_throwaway(engine, image_ref, ["sh", "-c", _CONTENTS_SCRIPT], timeout_s=600).stdout
    except EngineError:
        return None
    parts = out.split(_SPLIT + "\n")
    parts += [""] * (4 - len(parts))
    status, distro, sums, pip = parts[:4]
    jit = []
    for line in sums.splitlines():
        digest, _, path = line.partition("  ")
        if len(digest) == 64 and path:
            jit.append((path.strip(), digest))
    try:
        listed = json.loads(pip.strip() or "[]")
    except json.JSONDecodeError:
        listed = []
    return ImageContents(
        os_packages=tuple(documents.parse_dpkg_status(status)),
        distro=distro.strip() or "debian",
        jit_files=tuple(sorted(jit)),
        pip_packages=tuple(sorted((str(p["name"]), str(p["version"])) for p in listed)),
    )


def _bases(stack: ResolvedStack, lock: Lock | None) -> list[tuple[str, str | None]]:
    if lock is not None:
        return [(b.image, b.digest) for b in (lock.bases.build, lock.bases.runtime)]
    m = stack.manifest.bases
    return [(b.image, b.digest) for b in (m.build, m.runtime)]


def floating_base(stack: ResolvedStack, lock: Lock | None) -> bool:
    return any(digest is None for _, digest in _bases(stack, lock))


def attach_evidence(
    engine: Engine,
    registry: Registry,
    stack: ResolvedStack,
    rendered: RenderedContext,
    record: Record,
    digest_ref: str,
    build_client: str,
    signer: SigningKey | None = None,
) -> list[Descriptor]:
    """The verdict document, SBOM and provenance of the image pushed as digest_ref, each a
    DSSE envelope signed by signer (the build key) where given (evidence/signing.py), and
    then the signed index listing them (evidence/index.py: version 1 on a first push)."""
    store = ArtifactStore(registry)
    digest = imageref.digest_of(digest_ref)
    subject = store.image(digest)
    lock = rendered.lock
    report = _report(record)
    floating = floating_base(stack, lock)
    verdict = documents.verdict_document(digest, registry.repository, record, report, floating)
    sbom = _sbom(engine, registry.repository, digest, stack, rendered, floating)
    statement = _provenance(engine, registry.repository, digest, stack, rendered, build_client)
    pushed = []
    for kind, media_type, payload in (
        ("verdict", VERDICT_TYPE, documents.canonical(verdict)),
        ("sbom", SBOM_TYPE, sbom),
        ("provenance", PROVENANCE_TYPE, statement),
    ):
        annotations = {
            SUBJECT_ANNOTATION: digest,
            KIND_ANNOTATION: kind,
            TRANSPORT_ANNOTATION: store.transport,
        }
        layer_type, body = _signed(kind, media_type, payload, registry, digest, signer)
        annotations.update(_signer_annotation(signer))
        pushed.append(store.attach(subject, media_type, layer_type, body, annotations))
    if signer is not None:
        kinds = ("verdict", "sbom", "provenance")
        listed = list(zip(pushed, kinds, strict=True))
        how = {TRANSPORT_ANNOTATION: store.transport}
        pushed.append(publish_next(store, subject, listed, signer, [], how))
    return pushed


def _sbom(
    engine: Engine,
    repository: str,
    digest: str,
    stack: ResolvedStack,
    rendered: RenderedContext,
    floating: bool,
) -> bytes:
    """The SBOM: the locked Python set with its hashes (or what pip lists in the image, without
    a lock), the bases, the image's OS packages and JIT modules, and notes on what is missing."""
    lock = rendered.lock
    listed = image_contents(engine, _local(rendered))
    locked = []
    notes = []
    if listed is None:
        notes.append("the image has no shell: its OS packages and JIT modules are not listed")
    contents = listed or ImageContents(os_packages=(), distro="debian", jit_files=())
    if lock is not None:
        for name, package in sorted({**lock.python.heavy, **lock.python.packages}.items()):
            locked.append((name, str(package.version), list(package.hashes)))
        contents = ImageContents(contents.os_packages, contents.distro, contents.jit_files)
    else:
        notes.append("no lock: Python packages as pip lists them in the image, without hashes")
    if floating:
        notes.append("a base image is not pinned by digest (--allow-floating-base)")
    return documents.sbom(
        SbomInputs(repository, digest, locked, _bases(stack, lock), contents, notes)
    )


def _provenance(
    engine: Engine,
    repository: str,
    digest: str,
    stack: ResolvedStack,
    rendered: RenderedContext,
    build_client: str,
) -> bytes:
    """The provenance statement: the build's inputs (Dockerfile, the stack's manifests and its
    lock), its bases, the engine and build client, and the commit."""
    lock = rendered.lock
    files = {"Dockerfile": rendered.dockerfile.encode()}
    for source in stack.sources:
        files[f"stacks/{source.name}"] = source.read_bytes()
    if lock is not None:
        lock_file = stack.sources[0].with_name(f"{stack.name}.lock")
        if lock_file.is_file():
            files[f"stacks/{lock_file.name}"] = lock_file.read_bytes()
    return documents.provenance(
        ProvenanceInputs(
            repository=repository,
            digest=digest,
            stack=stack.name,
            content_hash=rendered.content_hash(),
            files=files,
            bases=_bases(stack, lock),
            engine=engine.address or DEFAULT_ADDRESS,
            build_client=build_client,
            commit=documents.git_commit(),
        )
    )


def _signed(
    kind: str,
    media_type: str,
    payload: bytes,
    registry: Registry,
    digest: str,
    signer: SigningKey | None,
) -> tuple[str, bytes]:
    """The layer's media type and bytes: the document as is, or its signed envelope."""
    if signer is None:
        return media_type, payload
    return ENVELOPE_MEDIA_TYPE, seal(kind, payload, registry.repository, digest, signer)


def attach_served(
    registry: Registry,
    digest: str,
    record: Record,
    verdict: ServedVerdict,
    report: dict[str, Any],
    signer: SigningKey | None = None,
    index_signers: list[PublicKey] | None = None,
) -> Descriptor:
    """A served verdict from a deployed host, as one more verdict document of the image,
    signed by signer (the operator's key) where given, and then the next version of the
    image's signed index (evidence/index.py), built on the newest one signed by signer or
    one of index_signers (the keys the recording host's policy trusts)."""
    store = ArtifactStore(registry)
    subject = store.image(digest)
    one = record.model_copy(update={"served": [verdict], "static": None, "unserved": None})
    document = documents.verdict_document(digest, registry.repository, one, report, False)
    annotations = {
        SUBJECT_ANNOTATION: digest,
        KIND_ANNOTATION: "verdict",
        TRANSPORT_ANNOTATION: store.transport,
    }
    layer_type, body = _signed(
        "verdict", VERDICT_TYPE, documents.canonical(document), registry, digest, signer
    )
    annotations.update(_signer_annotation(signer))
    attached = store.attach(subject, VERDICT_TYPE, layer_type, body, annotations)
    if signer is not None:
        how = {TRANSPORT_ANNOTATION: store.transport}
        publish_next(store, subject, [(attached, "verdict")], signer, index_signers or [], how)
    return attached


def _signer_annotation(signer: SigningKey | None) -> dict[str, str]:
    """The signer's public key beside the envelope, so a host with no trust policy can trust
    it on first use (ssh-style) and name its fingerprint; a policy never reads it."""
    if signer is None:
        return {}
    return {SIGNER_KEY_ANNOTATION: public_pem(signer.key.public_key()).decode()}


def _report(record: Record) -> dict[str, Any] | None:
    if record.report is None or not Path(record.report).is_file():
        return None
    try:
        loaded = json.loads(Path(record.report).read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _local(rendered: RenderedContext) -> str:
    return local_ref(rendered.stack, rendered.content_hash())


__all__ = ["attach_evidence", "attach_served", "floating_base", "image_contents"]
