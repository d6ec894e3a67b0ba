"""Trust on first use, ssh-style: where a hosts folder has no trust.yaml, the keys that signed
the evidence being relied on are trusted for what they signed, and written down.

A new user has no trust policy, and "no policy trusts everyone" let anyone with push access to
the registry vouch for an image. ssh faces the same first contact with a host key: it shows
the key's fingerprint, trusts it, writes it to known_hosts, and refuses a changed key loudly
from then on. Here `push --signing-key` publishes the signer's public key beside each envelope
(evidence/attach.py); on first use the key whose signature verifies is taken for the purposes
its documents claim (the one key that signed the static verdict, SBOM and provenance: `build`,
and `served` on the GPU kinds of the served verdicts that same key signed; several build keys
are refused, and another key, an operator's, is not learned), the evidence is read under that
policy as under a written one, and only once it is relied on is HOSTS_DIR/trust.yaml written
with the key (its id and fingerprint printed). From then on the written policy decides:
another key is refused, naming how to rotate (evidence/trust.py). Unsigned evidence gives
nothing to trust: it is refused unless --allow-unsigned. A published key proves nothing about
who holds it; that is TOFU's bargain, and docs/evidence.md's threat model says so.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from builder.errors import StackError
from builder.evidence.documents import (
    PROVENANCE_TYPE,
    SBOM_TYPE,
    SIGNER_KEY_ANNOTATION,
    VERDICT_TYPE,
)
from builder.evidence.keys import PublicKey, fingerprint, published_key
from builder.evidence.oci import ArtifactStore, Descriptor
from builder.evidence.signing import ENVELOPE_MEDIA_TYPE, read_envelope
from builder.evidence.trust import Purpose, TrustPolicy, Untrusted, load_policy
from builder.evidence.vouching import claims_of

#: The kind of each evidence artifact (evidence/signing.py's names).
KIND_OF_TYPE = {VERDICT_TYPE: "verdict", SBOM_TYPE: "sbom", PROVENANCE_TYPE: "provenance"}
#: Where first use keeps the keys it trusted, relative to trust.yaml.
KEYS_FOLDER = "keys"


@dataclass
class Learned:
    """The keys first use would trust, and for what: a policy not yet written."""

    path: Path
    keys: dict[str, PublicKey] = field(default_factory=dict)
    build: list[str] = field(default_factory=list)
    served: dict[str, list[str]] = field(default_factory=dict)

    def policy(self) -> TrustPolicy:
        return TrustPolicy(
            path=self.path,
            keys=dict(self.keys),
            build=tuple(self.build),
            served={kind: tuple(names) for kind, names in self.served.items()},
        )

    def add(self, key: PublicKey, purpose: Purpose, gpu_kind: str | None) -> None:
        name = f"first-use-{key.key_id[:12]}"
        self.keys[name] = key
        names = self.build if purpose == "build" else self.served.setdefault(gpu_kind or "", [])
        if name not in names:
            names.append(name)


def learn(store: ArtifactStore, reference: str, policy_file: Path) -> Learned:
    """The keys that signed the evidence of store's image `reference`, each checked against
    its own signature (one that does not verify is refused here, as under any policy)."""
    learned = Learned(policy_file)
    found: list[tuple[PublicKey, list[Any]]] = []
    image = store.image(reference)
    artifacts, _ = store.referrers(image.digest)
    for descriptor in artifacts:
        manifest = store.manifest(descriptor)
        kind = KIND_OF_TYPE.get(str(manifest.get("artifactType") or descriptor.artifact_type))
        layers = manifest.get("layers") or []
        if kind is None or len(layers) != 1:
            continue  # not evidence, or malformed: the reader refuses it with its reason
        layer = Descriptor.of(layers[0])
        pem = (manifest.get("annotations") or {}).get(SIGNER_KEY_ANNOTATION)
        if layer.media_type != ENVELOPE_MEDIA_TYPE or not isinstance(pem, str):
            continue  # unsigned, or no key published: nothing to trust
        name = f"{kind} {descriptor.digest[:19]}"
        key = published_key(pem, descriptor.digest)
        envelope = read_envelope(store.blob(layer), name)
        if key is None or envelope.signed_by([key]) is None:
            named = envelope.signatures[0].key_id[:16] if envelope.signatures else "none"
            raise Untrusted(
                f"{name}: its signature does not verify with the key published beside it "
                f"[key {named}]",
                file=policy_file,
                hint="the evidence was changed after it was signed, or signed by another key "
                "than it names: nothing was trusted or written; do not use this image",
            )
        claims = claims_of(kind, envelope.statement(name))
        found.append((key, claims))
    _one_build_key(found, policy_file)
    builder = next((k for k, c in found if ("build", None) in c), None)
    for key, claims in found:
        if builder is None or key.key_id != builder.key_id:
            continue  # another key than the build key's: refused unread (see below)
        for purpose, gpu_kind in claims:
            learned.add(key, purpose, gpu_kind)
    return learned


def _one_build_key(found: list[tuple[PublicKey, list[Any]]], policy_file: Path) -> None:
    """First use trusts one key, the one that signed the build documents (the static
    verdict, SBOM and provenance), as ssh trusts one host key. Build documents signed by
    several keys (a registry writer's own signature beside the build key's, most likely) are
    refused: nothing tells which is the builder's. Any other key (an operator's served
    verdict) is not learned: the read refuses it as unknown until trust.yaml names it."""
    keys = {k.key_id: k for k, claims in found if ("build", None) in claims}
    if len(keys) > 1:
        listed = ", ".join(f"{i[:16]} ({fingerprint(i)})" for i in sorted(keys))
        raise Untrusted(
            f"the build documents are signed by {len(keys)} keys: {listed}; first use trusts "
            "one key, and nothing tells which is the builder's",
            file=policy_file,
            hint="ask the image's builder for its key's fingerprint, then write trust.yaml "
            "naming that key (docs/evidence.md); nothing was trusted or written",
        )


def write_learned(learned: Learned, relied_on: list[str], tool: str) -> list[str]:
    """Write trust.yaml (and keys/NAME.pub) with the learned keys that vouched for evidence
    relied on (relied_on: their key ids); the lines to print, each key's id and fingerprint.
    A trust.yaml that appeared meanwhile is never replaced."""
    keep = {name: key for name, key in learned.keys.items() if key.key_id in relied_on}
    if not keep:
        return []
    folder = learned.path.parent
    for name, key in keep.items():
        _write_new(folder / KEYS_FOLDER / f"{name}.pub", key.pem(), replace=True)
    text = _policy_text(learned, keep, tool)
    _write_new(learned.path, text.encode(), replace=False)
    load_policy(learned.path)  # what was written reads back, or the error says where
    lines = []
    for name, key in keep.items():
        purposes = _purposes_of(learned, name)
        lines.append(
            f"first use: trusted key {name} (key id {key.key_id}, fingerprint "
            f"{fingerprint(key.key_id)}) for {purposes}; written to {learned.path}"
        )
    lines.append(
        "  compare the fingerprint with the key's owner; from now on evidence signed by any "
        "other key is refused"
    )
    return lines


def _purposes_of(learned: Learned, name: str) -> str:
    parts = ["build"] if name in learned.build else []
    parts += [f"served on {kind}" for kind, names in learned.served.items() if name in names]
    return ", ".join(parts)


def _policy_text(learned: Learned, keep: dict[str, PublicKey], tool: str) -> str:
    """trust.yaml as a person would write it, with a header saying where it came from."""
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [
        f"# Written by `{tool}` on first use (trust on first use, like ssh's known_hosts),",
        f"# {when}. Each key below was trusted because it signed the evidence relied on then;",
        "# check its fingerprint with its owner. Edit freely: `sm120-stacks keys check`.",
    ]
    for name, key in keep.items():
        lines.append(f"#   {name}: key id {key.key_id}, fingerprint {fingerprint(key.key_id)}")
    lines += ["version: 1", "keys:"]
    lines += [f"  {name}: {KEYS_FOLDER}/{name}.pub" for name in keep]
    lines += ["purposes:", f"  build: [{', '.join(n for n in learned.build if n in keep)}]"]
    served = {kind: [n for n in names if n in keep] for kind, names in learned.served.items()}
    served = {kind: names for kind, names in served.items() if names}
    if served:
        lines.append("  served:")
        lines += [f"    {json.dumps(kind)}: [{', '.join(names)}]" for kind, names in served.items()]
    return "\n".join(lines) + "\n"


def _write_new(path: Path, data: bytes, replace: bool) -> None:
    """Write path whole; where replace is False, only if nothing is there yet (link(2) fails
    on an existing name, so two first uses at once cannot overwrite each other's policy)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        if replace:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise StackError(
                "a trust policy appeared while first use was writing one: nothing replaced",
                file=path,
                hint="run the command again: it is read under that policy now",
            ) from None
    finally:
        Path(tmp).unlink(missing_ok=True)


__all__ = ["Learned", "learn", "write_learned"]
