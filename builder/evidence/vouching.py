"""One evidence document read under the hosts' trust policy: whose word it is, and whether
that word counts for what the document claims.

Kept apart from reader.py, which checks that evidence is intact and names the image: this
module decides who vouches. A signed document (a DSSE envelope layer) is opened; under a
policy its signer must be trusted for every purpose the document claims: a verdict with a
static verdict needs a `build` key, and each served verdict in it a key trusted for `served`
on that verdict's GPU kind; an SBOM and a provenance need a `build` key. An unsigned document
under a policy is refused, unless --allow-unsigned (migration only), which the caller records.
Without a policy (`evidence`, `report`: commands that only show) a signed document is still
checked against the key published beside it, so an envelope whose signature does not verify
is never read as a plain document; who that key is, only a policy (or first use,
evidence/firstuse.py) decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.evidence.keys import PublicKey
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, PREDICATE_OF_KIND, read_envelope, unseal
from builder.evidence.trust import (
    UNSIGNED_HINT,
    Purpose,
    TrustPolicy,
    Untrusted,
    vouch_envelope,
)


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
    published: PublicKey | None = None,
) -> Opened:
    """kind: verdict, sbom or provenance; name: what a refusal calls it (its artifact);
    published: the key published beside it (what a showing command checks it against)."""
    if layer_type != ENVELOPE_MEDIA_TYPE:
        if trust is not None and not allow_unsigned:
            raise Untrusted(
                f"{name}: unsigned [no key]",
                file=trust.path,
                hint=UNSIGNED_HINT,
            )
        return Opened(payload)
    envelope = read_envelope(payload, name)
    claimed = envelope.statement(name)
    document = unseal(kind, claimed)
    claims = claims_of(kind, claimed)
    if trust is None:
        trust = _published_only(published, name, claims)
    keys = set()
    for purpose, gpu_kind in claims:
        vouched = vouch_envelope(
            envelope,
            claimed,
            document=name,
            predicate_type=PREDICATE_OF_KIND[kind],
            digest=digest,
            policy=trust,
            purpose=purpose,
            gpu_kind=gpu_kind,
        )
        keys.add(vouched.key_id)
    return Opened(document, tuple(sorted(keys)), signed=True)


def _published_only(
    published: PublicKey | None, name: str, claims: list[tuple[Purpose, str | None]]
) -> TrustPolicy:
    """A policy of one key, the one published beside the document, for every purpose: what a
    signature is checked against where nothing decides whose word counts."""
    if published is None:
        raise Untrusted(
            f"{name}: signed, and no trust policy names its key and none is published beside "
            "it: its signature cannot be checked",
            hint="write HOSTS_DIR/trust.yaml naming the signer's public key (docs/evidence.md)",
        )
    where = Path("(the key published beside the document)")
    return TrustPolicy(
        path=where,
        keys={"published": published},
        build=("published",),
        served={kind: ("published",) for purpose, kind in claims if kind is not None},
    )


def claims_of(kind: str, statement: dict[str, Any]) -> list[tuple[Purpose, str | None]]:
    """What the document of a statement vouches for, read before its signature is checked
    only to know which purposes to check it against."""
    if kind != "verdict":
        return [("build", None)]
    data = statement.get("predicate")
    claims: list[tuple[Purpose, str | None]] = []
    if isinstance(data, dict) and data.get("static") is not None:
        claims.append(("build", None))
    for served in (data.get("served") or []) if isinstance(data, dict) else []:
        kind_of = served.get("gpu_kind") if isinstance(served, dict) else None
        claims.append(("served", str(kind_of)))
    return claims or [("build", None)]
