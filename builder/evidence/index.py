"""One signed, versioned index of an image's evidence: which documents exist, and how new.

A registry writer can take an artifact out of an image's referrers (a signed failed verdict,
say) or put back an older set: every document it leaves is still intact and signed, so no
per-document check notices. The Update Framework's snapshot role answers that with one signed
list of every document's digest and a version that only grows; this is that list. `push
--signing-key` publishes version 1 (the verdict, SBOM and provenance it attached); `smoke
--record --signing-key` the next version (what the newest index listed, and its served
verdict). Under a trust policy (evidence/reader.py) the newest index signed by a key the policy
trusts (for build, or served on any GPU kind) decides: a listed document the registry no longer
holds is a refusal; an unlisted one (unsigned, or signed by anyone) is ignored and named. And
the hosts folder remembers the newest version it has relied on per image
(HOSTS_DIR/evidence-versions.json): an older index, or none where one was seen, is a rollback
(evidence/decision.py refuses it).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from builder.errors import StackError
from builder.evidence.documents import (
    KIND_ANNOTATION,
    SIGNER_KEY_ANNOTATION,
    SUBJECT_ANNOTATION,
)
from builder.evidence.keys import PublicKey, SigningKey, public_pem
from builder.evidence.oci import ArtifactStore, Descriptor
from builder.evidence.signing import (
    ENVELOPE_MEDIA_TYPE,
    IN_TOTO_STATEMENT,
    read_envelope,
    sign,
    statement,
    subject_digests,
)
from builder.evidence.trust import TrustPolicy, Untrusted
from builder.files import write_atomic

INDEX_TYPE = "application/vnd.sm120-stacks.evidence-index.v1+json"
INDEX_PREDICATE = "https://sm120-stacks.dev/evidence-index/v1"
INDEX_SCHEMA = "sm120-stacks/evidence-index/v1"
#: The newest index version each image's evidence had when this hosts folder relied on it.
SEEN_FILE = "evidence-versions.json"


@dataclass(frozen=True)
class EvidenceIndex:
    """A verified index: its version, the documents it lists (artifact manifest digest ->
    kind), the key that signed it, and the artifact it came in."""

    version: int
    documents: dict[str, str]
    key_id: str = ""
    artifact: str = ""


@dataclass
class IndexView:
    """What an image's index artifacts say: the newest trusted index (the union of the
    documents of every trusted index of that version: two recordings at once), and the
    indexes not relied on (no trusted key signed them), named."""

    newest: EvidenceIndex | None = None
    ignored: list[str] = field(default_factory=list)


def parse_index(payload: bytes, name: str) -> EvidenceIndex:
    """An index statement's payload (JSON bytes) read; anything else is exit 2 naming it."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(name, "it is not JSON", getattr(exc, "lineno", None)) from None
    predicate = data.get("predicate") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("_type") != IN_TOTO_STATEMENT:
        raise _bad(name, "it is not an in-toto statement")
    if data.get("predicateType") != INDEX_PREDICATE or not isinstance(predicate, dict):
        raise _bad(name, f"its predicateType is not {INDEX_PREDICATE}")
    version = predicate.get("version")
    if predicate.get("schema") != INDEX_SCHEMA or type(version) is not int or version < 1:
        raise _bad(name, f"it is not of schema {INDEX_SCHEMA} with a version of 1 or more")
    documents: dict[str, str] = {}
    for position, entry in enumerate(predicate.get("documents") or []):
        digest = entry.get("digest") if isinstance(entry, dict) else None
        if not isinstance(digest, str) or not digest.startswith("sha256:"):
            raise _bad(name, f"documents[{position}] names no sha256 digest")
        if digest in documents:
            raise _bad(name, f"documents[{position}]: it lists {digest} twice")
        documents[digest] = str(entry.get("kind") or "document")
    return EvidenceIndex(version, documents)


def index_signers(policy: TrustPolicy) -> list[PublicKey]:
    """The keys whose index counts: those the policy trusts for build, or for served on any
    GPU kind (an operator's `smoke --record` publishes the next version)."""
    names = [*policy.build, *(n for names in policy.served.values() for n in names)]
    return [policy.keys[n] for n in dict.fromkeys(names) if n in policy.keys]


def read_indexes(
    store: ArtifactStore, image: str, artifacts: Iterable[Descriptor], signers: list[PublicKey]
) -> IndexView:
    """The newest index among image's artifacts that one of signers signed."""
    view = IndexView()
    for descriptor in artifacts:
        manifest = store.manifest(descriptor)
        if manifest.get("artifactType") != INDEX_TYPE:
            continue
        name = f"evidence index {descriptor.digest[:19]}"
        layers = manifest.get("layers") or []
        if len(layers) != 1 or Descriptor.of(layers[0]).media_type != ENVELOPE_MEDIA_TYPE:
            view.ignored.append(f"index {descriptor.digest} (unsigned)")
            continue
        envelope = read_envelope(store.blob(Descriptor.of(layers[0])), name)
        key = envelope.signed_by(signers)
        if key is None:
            view.ignored.append(f"index {descriptor.digest} (no trusted key signed it)")
            continue
        found = parse_index(envelope.payload, name)
        if image not in subject_digests(json.loads(envelope.payload)):
            raise _bad(name, f"it is signed for another image than {image}")
        found = EvidenceIndex(found.version, found.documents, key.key_id, descriptor.digest)
        newest = view.newest
        if newest is None or found.version > newest.version:
            view.newest = found
        elif found.version == newest.version:
            view.newest = EvidenceIndex(
                newest.version,
                {**newest.documents, **found.documents},
                newest.key_id,
                newest.artifact,
            )
    return view


def missing_documents(index: EvidenceIndex, present: Iterable[str]) -> list[str]:
    """The listed documents the registry no longer holds ("KIND DIGEST")."""
    held = set(present)
    return [f"{kind} {digest}" for digest, kind in index.documents.items() if digest not in held]


def refuse_incomplete(index: EvidenceIndex, present: Iterable[str], image: str) -> None:
    """A listed document gone from the referrers (a writer removed it): exit 2."""
    missing = missing_documents(index, present)
    if missing:
        raise Untrusted(
            f"the evidence index of {image} (version {index.version}, signed by key "
            f"{index.key_id[:16]}) lists {', '.join(missing)}, and the registry no longer holds "
            "it: a document was removed from the image's evidence",
            hint="nothing was pinned or deployed; do not use this image until its evidence is "
            "whole again (ask its builder, or the operator who recorded it, to push it back)",
        )


def publish_next(
    store: ArtifactStore,
    subject: Descriptor,
    added: list[tuple[Descriptor, str]],
    signer: SigningKey,
    trusted: list[PublicKey],
    annotations: dict[str, str] | None = None,
) -> Descriptor:
    """The next version of subject's index, signed by signer: what the newest index signed by
    signer or one of trusted listed, and added ((artifact, kind)); version 1 where none is.
    annotations: more of the artifact's (how it went up, as its documents say)."""
    own = PublicKey(signer.key_id, signer.key.public_key(), "the signing key")
    artifacts, _ = store.referrers(subject.digest)
    newest = read_indexes(store, subject.digest, artifacts, [own, *trusted]).newest
    documents = dict(newest.documents) if newest else {}
    documents.update({d.digest: kind for d, kind in added})
    predicate = {
        "schema": INDEX_SCHEMA,
        "version": _highest_version(store, artifacts) + 1,
        "documents": [{"digest": d, "kind": k} for d, k in documents.items()],
    }
    repository = f"{store.registry.host}/{store.name}"
    body = sign(statement(repository, subject.digest, INDEX_PREDICATE, predicate), signer)
    annotations = {
        **(annotations or {}),
        SUBJECT_ANNOTATION: subject.digest,
        KIND_ANNOTATION: "index",
        SIGNER_KEY_ANNOTATION: public_pem(signer.key.public_key()).decode(),
    }
    return store.attach(subject, INDEX_TYPE, ENVELOPE_MEDIA_TYPE, body, annotations)


def _highest_version(store: ArtifactStore, artifacts: list[Descriptor]) -> int:
    """The highest version any index of the image claims, whoever signed it: the next one
    must be above every index a host may have relied on (one signed by a key rotated out
    since, or an operator's this signer does not trust). A writer's inflated number only
    makes the next one bigger; an index that cannot be read claims nothing here."""
    highest = 0
    for descriptor in artifacts:
        try:
            manifest = store.manifest(descriptor)
            layers = manifest.get("layers") or []
            if manifest.get("artifactType") != INDEX_TYPE or len(layers) != 1:
                continue
            name = f"evidence index {descriptor.digest[:19]}"
            envelope = read_envelope(store.blob(Descriptor.of(layers[0])), name)
            highest = max(highest, parse_index(envelope.payload, name).version)
        except (StackError, ValueError, KeyError, TypeError):
            continue
    return highest


# -- freshness: the newest version this hosts folder relied on, per image --


def seen_version(hosts_dir: Path, image: str) -> int:
    """The newest index version relied on for image (REPOSITORY@DIGEST); 0 where none."""
    return _read_seen(hosts_dir / SEEN_FILE).get(image, 0)


def refuse_rollback(hosts_dir: Path, image: str, version: int | None) -> None:
    """An index older than the newest this folder relied on, or none (version None) where
    one was: exit 2."""
    seen = seen_version(hosts_dir, image)
    if (version or 0) < seen:
        now = f"version {version}" if version else "no signed index"
        raise Untrusted(
            f"the evidence of {image} is rolled back: the registry's newest trusted index is "
            f"{now}, and this hosts folder relied on version {seen}",
            file=hosts_dir / SEEN_FILE,
            hint="a registry writer put back an older set of documents (or removed the newer "
            "index): nothing was pinned or deployed; do not use this image until the newer "
            "evidence is back",
        )


def remember(hosts_dir: Path, image: str, version: int | None) -> None:
    """Note version (of the index relied on) for image where it is newer than what was seen
    (atomically, under a lock: two pins at once keep both images' versions)."""
    if version is None or version <= seen_version(hosts_dir, image):
        return
    path = hosts_dir / SEEN_FILE
    hosts_dir.mkdir(parents=True, exist_ok=True)
    folder = os.open(hosts_dir, os.O_RDONLY)  # the lock: the folder itself, no file of its own
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        seen = _read_seen(path)
        if version > seen.get(image, 0):
            seen[image] = version
            write_atomic(path, json.dumps({"schema": 1, "images": seen}, indent=2) + "\n")
    finally:
        os.close(folder)


def _read_seen(path: Path) -> dict[str, int]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        images = json.loads(text)["images"]
        return {str(k): int(v) for k, v in images.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StackError(
            f"not a record of evidence versions ({exc.__class__.__name__}: {exc})",
            file=path,
            key="images",
            hint="restore it from a backup; removing it forgets which versions were seen "
            "(rollbacks are then caught only from the next pin on)",
        ) from None


def _bad(name: str, why: str, line: int | None = None) -> StackError:
    return StackError(
        f"{name}: {why}",
        line=line,
        hint="nothing was pinned or deployed; the image's builder publishes the index with "
        "`sm120-stacks push STACK --signing-key FILE` (docs/evidence.md)",
    )


__all__ = [
    "INDEX_TYPE",
    "EvidenceIndex",
    "IndexView",
    "index_signers",
    "missing_documents",
    "parse_index",
    "publish_next",
    "read_indexes",
    "refuse_incomplete",
    "refuse_rollback",
    "remember",
    "seen_version",
]
