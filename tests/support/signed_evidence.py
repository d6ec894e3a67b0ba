"""An image's evidence as `push` attaches it (verdict, SBOM, provenance), signed by a key file
or unsigned, into the repository a pin's image names: for engine tests whose images are not
built by `push` (test_trust_warm's, test_trust_deploy's), now that `deploy --apply` reads the
pinned digest's evidence under the hosts' trust policy (builder/hosts/evidence_gate.py)."""

from __future__ import annotations

from pathlib import Path

from builder.evidence import documents
from builder.evidence.keys import load_signing_key, public_pem
from builder.evidence.oci import ArtifactStore
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, seal
from builder.image.records import Record, ServedVerdict

TYPES = {
    "verdict": documents.VERDICT_TYPE,
    "sbom": documents.SBOM_TYPE,
    "provenance": documents.PROVENANCE_TYPE,
}


def evidence_documents(
    image: str, stack: str, content_hash: str, served: list[ServedVerdict]
) -> dict[str, bytes]:
    """The three documents of image (REPOSITORY@DIGEST), as push makes them."""
    repository, digest = image.rsplit("@", 1)
    record = Record(stack=stack, content_hash=content_hash, static="passed", served=served)
    verdict = documents.verdict_document(digest, repository, record, None, False)
    provenance = documents.provenance(
        documents.ProvenanceInputs(
            repository,
            digest,
            stack,
            content_hash,
            {"Dockerfile": b"FROM x"},
            [],
            "unix:///var/run/docker.sock",
            "buildx",
            None,
        )
    )
    sbom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [{"bom-ref": "base/x"}]}
    return {
        "verdict": documents.canonical(verdict),
        "sbom": documents.canonical(sbom),
        "provenance": provenance,
    }


def attach_document(image: str, kind: str, payload: bytes, signer: Path | None) -> None:
    """One artifact beside image as push attaches it; a DSSE envelope signed by signer's key
    where given."""
    store = ArtifactStore.of_image(image)
    repository, digest = image.rsplit("@", 1)
    layer, body = TYPES[kind], payload
    annotations = {documents.SUBJECT_ANNOTATION: digest, documents.KIND_ANNOTATION: kind}
    if signer is not None:
        layer = ENVELOPE_MEDIA_TYPE
        key = load_signing_key(signer)
        body = seal(kind, payload, repository, digest, key)
        # push publishes the signer's public key beside the envelope (first use reads it)
        annotations[documents.SIGNER_KEY_ANNOTATION] = public_pem(key.key.public_key()).decode()
    store.attach(store.image(digest), TYPES[kind], layer, body, annotations)


def attach_evidence(
    image: str,
    stack: str,
    content_hash: str,
    signer: Path | None,
    served: list[ServedVerdict] | None = None,
) -> None:
    for kind, payload in evidence_documents(image, stack, content_hash, served or []).items():
        attach_document(image, kind, payload, signer)


def write_trust(hosts_dir: Path, signer: Path, name: str, served_on: list[str]) -> Path:
    """hosts_dir/trust.yaml naming signer's public key (signer with .pub for .key, as `keys
    generate` writes them) for builds and the served verdicts of served_on's GPU kinds: what
    first use would write, for a test whose commands run at once (two first uses at once
    refuse the second: evidence/firstuse.py). The policy file."""
    import json

    keys = hosts_dir / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    (keys / f"{name}.pub").write_bytes(signer.with_suffix(".pub").read_bytes())
    document = {
        "version": 1,
        "keys": {name: f"keys/{name}.pub"},
        "purposes": {"build": [name], "served": {kind: [name] for kind in served_on}},
    }
    policy = hosts_dir / "trust.yaml"
    policy.write_text(json.dumps(document))  # JSON is YAML
    return policy
