"""Read an image's evidence back from the registry, and refuse what cannot be relied on.

`pull` and `pin` on a machine with no records of the image rely on this alone, so every
artifact is checked before its word counts: its manifest and blob hash to their descriptors
(oci.ArtifactStore), its `subject` is the image's own manifest, and the document inside names
that same digest (a verdict copied from another image is refused, not merged), and a verdict
document must validate as evidence/documents.py's `VerdictDocument`. A missing
verdict (an image pushed before evidence existed, or by `push` of another tool) is an error
with the remedy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from builder.errors import StackError
from builder.evidence.documents import (
    IN_TOTO_STATEMENT,
    PROVENANCE_TYPE,
    SBOM_TYPE,
    SIGNER_KEY_ANNOTATION,
    SUBJECT_ANNOTATION,
    VERDICT_SCHEMA,
    VERDICT_TYPE,
    WARM_CACHE_TYPE,
    VerdictDocument,
    sbom_summary,
)
from builder.evidence.index import (
    INDEX_TYPE,
    index_signers,
    read_indexes,
    refuse_incomplete,
)
from builder.evidence.keys import PublicKey, published_key
from builder.evidence.oci import ArtifactStore, Descriptor, ManifestUnknown
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE
from builder.evidence.trust import UNSIGNED_HINT, TrustPolicy, Untrusted
from builder.evidence.vouching import Opened, open_document
from builder.image.names import content_tag
from builder.image.records import Record
from builder.image.registry import Registry
from builder.image.verdicts import Verdicts, gpu_kind_key, merge, recency


@dataclass
class Evidence:
    """What the registry holds for one image, every piece checked."""

    repository: str
    digest: str
    #: "referrers API" or "referrers tag": how the artifacts were found.
    found_by: str
    stack: str
    content_hash: str
    #: Every verdict document's verdicts, merged (image/verdicts.py `merge`).
    verdicts: Verdicts = field(default_factory=Verdicts)
    floating_base: bool = False
    sbom: dict[str, int] | None = None
    provenance: dict[str, Any] | None = None
    artifacts: list[Descriptor] = field(default_factory=list)
    #: Warm-cache artifacts of the image (builder/warm/), counted, not read.
    warm_caches: int = 0
    #: The key ids the trust policy trusted for the documents relied on (issue 35).
    signed_by: list[str] = field(default_factory=list)
    #: Documents relied on unsigned under a policy (--allow-unsigned).
    unsigned: list[str] = field(default_factory=list)
    #: Unsigned documents beside signed evidence, not relied on ("KIND DIGEST"): a registry
    #: writer's extra stops nothing, and is named.
    ignored: list[str] = field(default_factory=list)
    #: The version of the newest signed index relied on (evidence/index.py); None: none.
    index_version: int | None = None
    #: Documents and indexes beside a signed index that it does not list, or that no trusted
    #: key signed ("KIND DIGEST ..."): not relied on, named.
    unlisted: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.repository}@{self.digest}"

    def record(self) -> Record:
        """The evidence as the record a build folder would hold after test and push."""
        unserved = self.verdicts.unserved
        if not self.verdicts.served and unserved is None:
            unserved = "no served verdict in the registry"
        return Record(
            stack=self.stack,
            content_hash=self.content_hash,
            static=self.verdicts.static,
            served=self.verdicts.served,
            unserved=unserved,
            pushed={self.repository: self.ref},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.ref,
            "found_by": self.found_by,
            "stack": self.stack,
            "content_hash": self.content_hash,
            **self.verdicts.model_dump(mode="json"),
            "tests": self.verdicts.tests,
            "floating_base": self.floating_base,
            "sbom": self.sbom,
            "provenance": self.provenance,
            "artifacts": [a.to_json() for a in self.artifacts],
            "warm_caches": self.warm_caches,
            "signed_by": self.signed_by,
            "unsigned": self.unsigned,
            "ignored": self.ignored,
            "index_version": self.index_version,
            "unlisted": self.unlisted,
        }


def has_image(registry: Registry, stack: str, content_hash: str) -> bool:
    """Whether the registry holds the image of stack's content tag (its manifest answers)."""
    store = ArtifactStore(registry)
    try:
        store.image(content_tag(stack, content_hash))
    except ManifestUnknown:
        return False
    return True


def read_evidence(
    registry: Registry,
    stack: str,
    content_hash: str | None = None,
    reference: str | None = None,
    trust: TrustPolicy | None = None,
    allow_unsigned: bool = False,
    store: ArtifactStore | None = None,
) -> Evidence:
    """The evidence of the image tagged with stack's content tag (or reference: a tag or
    sha256 digest). content_hash, when given, must be what the verdict names. trust: the
    hosts' policy, which every document must satisfy (evidence/vouching.py), and which needs
    a verdict, an SBOM and a provenance. store: the repository to read, where it is not the
    registry's own (a pin's image, ArtifactStore.of_image)."""
    store = store or ArtifactStore(registry)
    repository = f"{store.registry.host}/{store.name}"
    tag = reference or (content_tag(stack, content_hash) if content_hash else stack)
    image = store.image(tag)
    artifacts, found_by = store.referrers(image.digest)
    verdicts: list[VerdictDocument] = []
    signed: set[int] = set()  # the verdicts that came signed: they outrank unsigned ones
    evidence = Evidence(repository, image.digest, found_by, stack, "")
    listed = _listed(store, evidence, artifacts, trust)
    for descriptor in artifacts:
        read = _read_artifact(store, descriptor, evidence, listed, trust, allow_unsigned)
        if read is not None:
            verdict, came_signed = read
            verdicts.append(verdict)
            if came_signed:
                signed.add(id(verdict))
    _require_verdict(evidence, verdicts, trust, registry, tag)
    if trust is not None:
        _require_all(evidence, trust)
    _merge(evidence, verdicts, content_hash, signed)
    return evidence


def _read_artifact(
    store: ArtifactStore,
    descriptor: Descriptor,
    evidence: Evidence,
    listed: set[str] | None,
    trust: TrustPolicy | None,
    allow_unsigned: bool,
) -> tuple[VerdictDocument, bool] | None:
    """One artifact of the image, checked (its subject and its annotation name the image, it
    has one layer) and read into evidence: an SBOM or a provenance is kept there, a warm cache
    counted; a verdict is returned, with whether it came signed, since only the whole set can
    be weighed (_merge). An index (read by _listed), an unsigned extra and a document no
    trusted index lists are passed over, the last two named in evidence."""
    digest = evidence.digest
    manifest = store.manifest(descriptor)
    subject = (manifest.get("subject") or {}).get("digest")
    if subject != digest:
        raise _refused(digest, f"artifact {descriptor.digest} refers to {subject}")
    if manifest.get("artifactType") == WARM_CACHE_TYPE:
        evidence.warm_caches += 1
        return None
    layers = manifest.get("layers") or []
    if len(layers) != 1:
        raise _refused(digest, f"artifact {descriptor.digest} has {len(layers)} layers")
    layer = Descriptor.of(layers[0])
    kind = manifest.get("artifactType") or descriptor.artifact_type
    if kind == INDEX_TYPE:
        return None  # read by _listed
    if _unsigned_extra(str(kind), layer, trust, allow_unsigned):
        evidence.ignored.append(f"{_KINDS[str(kind)]} {descriptor.digest}")
        return None
    if _unlisted(str(kind), layer, descriptor, listed):
        evidence.unlisted.append(f"{_KINDS[str(kind)]} {descriptor.digest}")
        return None
    published = _published(manifest, descriptor)
    opened = _open(store, layer, str(kind), descriptor, evidence, trust, allow_unsigned, published)
    payload = opened.payload
    evidence.artifacts.append(descriptor)
    verdict = None
    if kind == VERDICT_TYPE:
        verdict = _verdict(payload, digest, descriptor)
    elif kind == SBOM_TYPE:
        evidence.sbom = sbom_summary(_json(payload, descriptor, digest))
    elif kind == PROVENANCE_TYPE:
        evidence.provenance = _provenance(payload, digest, descriptor)
    annotated = (manifest.get("annotations") or {}).get(SUBJECT_ANNOTATION)
    if annotated is not None and annotated != digest:
        raise _refused(digest, f"artifact {descriptor.digest} is annotated {annotated}")
    return (verdict, opened.signed) if verdict is not None else None


def _require_verdict(
    evidence: Evidence,
    verdicts: list[VerdictDocument],
    trust: TrustPolicy | None,
    registry: Registry,
    tag: str,
) -> None:
    """An image with no verdict to rely on is refused, saying why: its only verdict unsigned
    under a policy, or none at all (pushed without its evidence: the hint says how to send
    it again)."""
    if not verdicts and any(i.startswith("verdict ") for i in evidence.ignored) and trust:
        first = next(i for i in evidence.ignored if i.startswith("verdict "))
        raise Untrusted(
            f"{first[:27]}: unsigned [no key]: the only verdict is unsigned",
            file=trust.path,
            hint=UNSIGNED_HINT,
        )
    if not verdicts:
        stack = evidence.stack
        raise StackError(
            f"the registry holds no verdict for {evidence.ref} "
            f"({tag}): it went up without its evidence (a push whose evidence failed, which "
            "said so and recorded nothing; or a push before sm120-stacks kept evidence in the "
            "registry, or by another tool)",
            hint=f"on the machine that tested it, `sm120-stacks push {stack} --registry "
            f"{registry.option}` again (it sends only the evidence); or test it here: "
            f"sm120-stacks test {stack}",
        )


def _listed(
    store: ArtifactStore,
    evidence: Evidence,
    artifacts: list[Descriptor],
    trust: TrustPolicy | None,
) -> set[str] | None:
    """Under a policy, the documents the newest trusted index lists (refused where one is
    gone from the registry); None where no trusted index is (evidence pushed before indexes,
    or with no policy: then every document is read, as before)."""
    if trust is None:
        return None
    view = read_indexes(store, evidence.digest, artifacts, index_signers(trust))
    if view.newest is None:
        return None
    refuse_incomplete(view.newest, (a.digest for a in artifacts), evidence.ref)
    evidence.index_version = view.newest.version
    evidence.unlisted += view.ignored
    return set(view.newest.documents)


#: The kind of each evidence artifact, as evidence/signing.py names predicates.
_KINDS = {VERDICT_TYPE: "verdict", SBOM_TYPE: "sbom", PROVENANCE_TYPE: "provenance"}


def _open(
    store: ArtifactStore,
    layer: Descriptor,
    artifact_type: str,
    descriptor: Descriptor,
    evidence: Evidence,
    trust: TrustPolicy | None,
    allow_unsigned: bool,
    published: PublicKey | None = None,
) -> Opened:
    """The document of one evidence artifact, opened and (under a policy) vouched for
    (evidence/vouching.py); the keys it rests on and an unsigned reliance noted in evidence.
    An artifact of a kind this reader does not know is passed on as it is."""
    raw = store.blob(layer)
    kind = _KINDS.get(artifact_type)
    if kind is None:
        return Opened(raw)
    name = f"{kind} {descriptor.digest[:19]}"
    opened = open_document(
        kind, name, raw, layer.media_type, evidence.digest, trust, allow_unsigned, published
    )
    evidence.signed_by += [k for k in opened.key_ids if k not in evidence.signed_by]
    if trust is not None and not opened.signed:
        evidence.unsigned.append(descriptor.digest)
    return opened


def _unsigned_extra(
    artifact_type: str, layer: Descriptor, trust: TrustPolicy | None, allow_unsigned: bool
) -> bool:
    """An unsigned evidence document under a policy that does not allow them: never relied
    on, so not read (its content cannot refuse anything); a needed document missing because of
    it is refused after the loop."""
    return (
        trust is not None
        and not allow_unsigned
        and artifact_type in _KINDS
        and layer.media_type != ENVELOPE_MEDIA_TYPE
    )


def _unlisted(
    artifact_type: str, layer: Descriptor, descriptor: Descriptor, listed: set[str] | None
) -> bool:
    """A signed evidence document the newest trusted index does not list: a writer's, even
    one signed by its own key, never relied on and not read. (Unsigned ones are ignored as
    unsigned, or relied on with --allow-unsigned as before: a signature never outranks.)"""
    return (
        listed is not None
        and artifact_type in _KINDS
        and layer.media_type == ENVELOPE_MEDIA_TYPE
        and descriptor.digest not in listed
    )


def _published(manifest: dict[str, Any], descriptor: Descriptor) -> PublicKey | None:
    """The signer's key published beside an artifact (its annotation), if it is one."""
    pem = (manifest.get("annotations") or {}).get(SIGNER_KEY_ANNOTATION)
    return published_key(pem, descriptor.digest) if isinstance(pem, str) else None


def _require_all(evidence: Evidence, trust: TrustPolicy) -> None:
    """Under a policy a pin rests on every document it names, not a verdict alone."""
    missing = [
        n for n, v in (("SBOM", evidence.sbom), ("provenance", evidence.provenance)) if not v
    ]
    unsigned = [n for n in missing if any(i.startswith(n.lower()) for i in evidence.ignored)]
    if unsigned:
        raise Untrusted(
            f"{' and '.join(unsigned)}: unsigned [no key]: no signed one in the registry",
            file=trust.path,
            hint=UNSIGNED_HINT,
        )
    if missing:
        raise _refused(
            evidence.digest,
            f"the trust policy ({trust.path}) needs a signed verdict, SBOM and provenance, and "
            f"the registry holds no {' and no '.join(missing)}",
        )


def _merge(
    evidence: Evidence,
    documents: list[VerdictDocument],
    content_hash: str | None,
    signed: set[int] | None = None,
) -> None:
    """Every document's verdicts as one (verdicts.merge: the newest push's static verdict, the
    newest served verdict per GPU kind); the newest push also says whether a base floated.
    A signed document (signed: their ids) outranks any unsigned one whatever its date."""
    signed = signed or set()
    documents = sorted(documents, key=lambda d: (id(d) in signed, recency(d.recorded_at)))
    for document in documents:
        if content_hash is not None and document.content_hash != content_hash:
            raise _refused(
                evidence.digest,
                f"a verdict is of content hash {document.content_hash}, not {content_hash}",
            )
        evidence.stack = document.stack or evidence.stack
        evidence.content_hash = document.content_hash
        if document.static is not None:
            evidence.floating_base = document.floating_base
    evidence.verdicts = merge(_signed_first(documents, signed))


def _signed_first(documents: list[VerdictDocument], signed: set[int]) -> list[VerdictDocument]:
    """An unsigned document (relied on with --allow-unsigned) keeps only the served verdicts
    of GPU kinds no signed document speaks for: its own dates cannot outrank a signature."""
    if not signed:
        return documents
    kinds = {gpu_kind_key(s.gpu_kind) for d in documents if id(d) in signed for s in d.served}
    return [
        d
        if id(d) in signed
        else d.model_copy(
            update={"served": [s for s in d.served if gpu_kind_key(s.gpu_kind) not in kinds]}
        )
        for d in documents
    ]


def _json(payload: bytes, descriptor: Descriptor, digest: str) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise _refused(digest, f"artifact {descriptor.digest} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _refused(digest, f"artifact {descriptor.digest} is not a JSON object")
    return data


def _verdict(payload: bytes, digest: str, descriptor: Descriptor) -> VerdictDocument:
    """The document, checked: of our schema, naming this image, and every field valid (what
    the pusher wrote); else the evidence is refused, naming the document."""
    data = _json(payload, descriptor, digest)
    if data.get("schema") != VERDICT_SCHEMA:
        raise _refused(digest, f"verdict {descriptor.digest} is of schema {data.get('schema')}")
    image = data.get("image")
    named = image.get("digest") if isinstance(image, dict) else None
    if named != digest:
        raise _refused(digest, f"verdict {descriptor.digest} is a report for {named}")
    try:
        return VerdictDocument.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(document)"
        why = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        raise _refused(
            digest, f"verdict {descriptor.digest} does not validate: {key}: {why}"
        ) from None


def _provenance(payload: bytes, digest: str, descriptor: Descriptor) -> dict[str, Any]:
    data = _json(payload, descriptor, digest)
    subjects = [s.get("digest", {}).get("sha256") for s in data.get("subject") or []]
    if data.get("_type") != IN_TOTO_STATEMENT or digest.removeprefix("sha256:") not in subjects:
        raise _refused(digest, f"provenance {descriptor.digest} does not name the image")
    return data


def _refused(digest: str, why: str) -> StackError:
    return StackError(
        f"the evidence of {digest} cannot be relied on: {why}",
        hint="nothing was pinned; push the image and its evidence again from the machine "
        "that tested it (`sm120-stacks push STACK`)",
    )


__all__ = ["Evidence", "has_image", "read_evidence"]
