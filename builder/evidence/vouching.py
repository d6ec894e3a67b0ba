"""One evidence document read under the hosts' trust policy: whose word it is, and whether
that word counts for what the document claims.

Kept apart from reader.py, which checks that evidence is intact and names the image: this
module decides who vouches. A signed document (a DSSE envelope layer) is opened; under a
policy its signer must be trusted for every purpose the document claims: a verdict with a
static verdict needs a `build` key, and each served verdict in it a key trusted for `served`
on that verdict's GPU kind; an SBOM and a provenance need a `build` key. An unsigned document
under a policy is refused, unless --allow-unsigned (migration only), which the caller records.
Without a policy nothing is verified, as before signatures existed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from builder.errors import StackError
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, PREDICATE_OF_KIND, read_envelope, unseal
from builder.evidence.trust import Purpose, TrustPolicy, Untrusted, vouch


@dataclass(frozen=True)
class Opened:
    """A document's bytes as its pusher wrote them, and who signed it."""

    payload: bytes
    #: The key ids the policy trusted for it; empty when unsigned or unverified.
    key_ids: tuple[str, ...] = ()
    signed: bool = False


def open_document(
    kind: str,
    name: str,
    payload: bytes,
    layer_type: str,
    digest: str,
    trust: TrustPolicy | None,
    allow_unsigned: bool = False,
) -> Opened:
    """kind: verdict, sbom or provenance; name: what a refusal calls it (its artifact)."""
    if layer_type != ENVELOPE_MEDIA_TYPE:
        if trust is not None and not allow_unsigned:
            raise Untrusted(
                f"{name}: unsigned [no key]",
                file=trust.path,
                hint="push it again with a build key (push --signing-key FILE); "
                "--allow-unsigned pins it anyway (recorded in the pin, reported by drift)",
            )
        return Opened(payload)
    envelope = read_envelope(payload, name)
    claimed = envelope.statement(name)
    document = unseal(kind, claimed)
    if trust is None:
        return Opened(document, signed=True)
    keys = set()
    for purpose, gpu_kind in _claims(kind, document, name):
        vouched = vouch(
            payload,
            document=name,
            predicate_type=PREDICATE_OF_KIND[kind],
            digest=digest,
            policy=trust,
            purpose=purpose,
            gpu_kind=gpu_kind,
        )
        keys.add(vouched.key_id)
    return Opened(document, tuple(sorted(keys)), signed=True)


def _claims(kind: str, document: bytes, name: str) -> list[tuple[Purpose, str | None]]:
    """What the document vouches for, read from the statement before its signature is
    checked only to know which purposes to check it against."""
    if kind != "verdict":
        return [("build", None)]
    try:
        data = json.loads(document)
    except ValueError:
        raise StackError(f"{name}: its verdict is not JSON") from None
    claims: list[tuple[Purpose, str | None]] = []
    if isinstance(data, dict) and data.get("static") is not None:
        claims.append(("build", None))
    for served in (data.get("served") or []) if isinstance(data, dict) else []:
        kind_of = served.get("gpu_kind") if isinstance(served, dict) else None
        claims.append(("served", str(kind_of)))
    return claims or [("build", None)]
