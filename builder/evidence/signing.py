"""DSSE envelopes over in-toto Statement v1: what `cosign attest` makes and
`cosign verify-attestation` checks.

Evidence in the registry used to be intact and bound to the image's digest but signed by no one,
so anyone with push access could write a verdict. Here each document a host relies on is the
predicate of an in-toto statement whose subject is the image digest, and the statement is the
payload of a DSSE envelope signed with an ECDSA P-256 key (builder/evidence/keys.py): the
signature covers DSSE's pre-authentication encoding of the payload type and the exact payload
bytes, so nothing in the statement can change without the signature failing. The signature is
ASN.1 DER over SHA-256, as cosign and securesystemslib write and read it. Signing and
verifying are `cryptography`'s; this module only encodes and parses.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from builder.errors import StackError
from builder.evidence.keys import PublicKey, SigningKey

#: The media type of a DSSE envelope as an OCI layer (cosign's attestation layers).
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
#: The DSSE payload type of an in-toto statement.
IN_TOTO_PAYLOAD = "application/vnd.in-toto+json"

IN_TOTO_STATEMENT = "https://in-toto.io/Statement/v1"

#: One predicate type per kind of document (cosign's `--type` takes these URIs as they are).
#: Spelled here, not imported from documents.py, so that verifying needs nothing of how the
#: documents are made (the verdict's is documents.VERDICT_SCHEMA, the provenance's SLSA v1).
VERDICT_PREDICATE = "https://sm120-stacks.dev/verdict/v1"
SBOM_PREDICATE = "https://cyclonedx.org/bom"
PROVENANCE_PREDICATE = "https://slsa.dev/provenance/v1"
WARM_CACHE_PREDICATE = "https://sm120-stacks.dev/warm-cache/v1"
PREDICATE_TYPES = (VERDICT_PREDICATE, SBOM_PREDICATE, PROVENANCE_PREDICATE, WARM_CACHE_PREDICATE)

#: An envelope larger than this is refused unread (the largest verdict document is ~1 MB).
MAX_ENVELOPE_BYTES = 64 * 1024 * 1024


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what the signature is made over."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def statement(
    repository: str, digest: str, predicate_type: str, predicate: dict[str, Any]
) -> dict[str, Any]:
    """An in-toto Statement v1 about the image repository@digest (digest `sha256:<hex>`)."""
    algorithm, _, value = digest.partition(":")
    if algorithm != "sha256" or len(value) != 64:
        raise ValueError(f"not a sha256 image digest: {digest!r}")
    return {
        "_type": IN_TOTO_STATEMENT,
        "subject": [{"name": repository, "digest": {"sha256": value}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def sign(statement_data: dict[str, Any], key: SigningKey) -> bytes:
    """The DSSE envelope (JSON bytes) of statement_data signed by key."""
    payload = json.dumps(statement_data, sort_keys=True, separators=(",", ":")).encode()
    signature = key.key.sign(pae(IN_TOTO_PAYLOAD, payload), ec.ECDSA(hashes.SHA256()))
    envelope = {
        "payloadType": IN_TOTO_PAYLOAD,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": key.key_id, "sig": base64.b64encode(signature).decode()}],
    }
    return json.dumps(envelope, sort_keys=True).encode()


@dataclass(frozen=True)
class Signature:
    key_id: str
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    """A parsed DSSE envelope: well-formed, not yet verified."""

    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...]

    def signed_by(self, keys: list[PublicKey]) -> PublicKey | None:
        """The first of keys whose signature on this envelope verifies, or None. A signature
        naming a key id is tried only against that key; one naming none, against each."""
        message = pae(self.payload_type, self.payload)
        for signature in self.signatures:
            for key in keys:
                if signature.key_id and signature.key_id != key.key_id:
                    continue
                try:
                    key.key.verify(signature.sig, message, ec.ECDSA(hashes.SHA256()))
                except InvalidSignature:
                    continue
                return key
        return None

    def statement(self, source: str) -> dict[str, Any]:
        """The in-toto statement the payload holds (read before any signature is checked
        only to name what is refused; nothing in it is trusted until signed_by says so)."""
        try:
            data = json.loads(self.payload)
        except ValueError:
            raise _malformed(source, "its payload is not JSON") from None
        if not isinstance(data, dict) or data.get("_type") != IN_TOTO_STATEMENT:
            raise _malformed(
                source, f"its payload is not an in-toto statement ({IN_TOTO_STATEMENT})"
            )
        if not isinstance(data.get("subject"), list) or not isinstance(data.get("predicate"), dict):
            raise _malformed(source, "its statement has no subject list or no predicate")
        return data


def subject_digests(statement_data: dict[str, Any]) -> set[str]:
    """Every `sha256:<hex>` the statement's subjects name."""
    found = set()
    for subject in statement_data.get("subject", []):
        digest = subject.get("digest") if isinstance(subject, dict) else None
        if isinstance(digest, dict) and isinstance(digest.get("sha256"), str):
            found.add(f"sha256:{digest['sha256']}")
    return found


def read_envelope(raw: bytes, source: str) -> Envelope:
    """Parse a DSSE envelope; anything that is not one is a StackError naming source."""
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise _malformed(source, f"it is larger than {MAX_ENVELOPE_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        line = getattr(exc, "lineno", None)
        raise _malformed(source, "it is not JSON", line=line) from None
    if not isinstance(data, dict) or not {"payloadType", "payload", "signatures"} <= data.keys():
        raise _malformed(source, "it is not a DSSE envelope (payloadType, payload, signatures)")
    payload_type, signatures = data["payloadType"], data["signatures"]
    if payload_type != IN_TOTO_PAYLOAD:
        raise _malformed(source, f"its payloadType is {payload_type!r}, not {IN_TOTO_PAYLOAD}")
    if not isinstance(signatures, list):
        raise _malformed(source, "its signatures are not a list")
    try:
        payload = base64.b64decode(str(data["payload"]), validate=True)
        parsed = tuple(
            Signature(
                str(item.get("keyid") or ""), base64.b64decode(str(item["sig"]), validate=True)
            )
            for item in signatures
        )
    except (binascii.Error, KeyError, AttributeError, TypeError):
        raise _malformed(source, "its payload or a signature is not base64") from None
    return Envelope(payload_type=payload_type, payload=payload, signatures=parsed)


def _malformed(source: str, why: str, line: int | None = None) -> StackError:
    return StackError(
        f"{source}: {why}",
        line=line,
        hint="evidence is a DSSE envelope over an in-toto statement; re-push the image's "
        "evidence with `sm120-stacks push` (it signs what it attaches)",
    )


#: The predicate type of each evidence document, by the kind its artifact is annotated with.
PREDICATE_OF_KIND = {
    "verdict": VERDICT_PREDICATE,
    "sbom": SBOM_PREDICATE,
    "provenance": PROVENANCE_PREDICATE,
}


def seal(kind: str, payload: bytes, repository: str, digest: str, key: SigningKey) -> bytes:
    """An evidence document (JSON bytes) as the DSSE envelope of a statement about the image:
    the verdict and the SBOM become the predicate; the provenance is already an in-toto
    statement of SLSA v1 and is signed as it is."""
    document = json.loads(payload)
    if kind == "provenance":
        return sign(document, key)
    return sign(statement(repository, digest, PREDICATE_OF_KIND[kind], document), key)


def unseal(kind: str, statement_data: dict[str, Any]) -> bytes:
    """The document a sealed statement carries, as JSON bytes (what seal was given)."""
    document = statement_data if kind == "provenance" else statement_data["predicate"]
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
