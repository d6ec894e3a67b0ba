"""The trust decision of every command that relies on an image's registry evidence (`pin`,
`pull`, `build --pull-or-build`, `deploy --apply`): whose signatures count, made in one place.

With HOSTS_DIR/trust.yaml, that policy decides. Without one, the keys that signed the evidence
are trusted on first use and written to trust.yaml once the evidence is relied on
(evidence/firstuse.py); unsigned evidence is refused unless --allow-unsigned. There is no
longer a path on which nothing is verified: "no policy" used to mean "everyone is trusted".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from builder.evidence.firstuse import learn, write_learned
from builder.evidence.index import refuse_rollback, remember
from builder.evidence.oci import ArtifactStore
from builder.evidence.reader import Evidence, read_evidence
from builder.evidence.trust import TrustPolicy, host_policy, policy_path
from builder.image.names import content_tag
from builder.image.registry import Registry


@dataclass
class Relied:
    """Evidence relied on, the policy it was read under, and what to tell the user."""

    evidence: Evidence
    policy: TrustPolicy
    said: list[str] = field(default_factory=list)
    #: Whether the policy was learned (and written) by this call.
    first_use: bool = False


def relied_evidence(
    hosts_dir: Path,
    registry: Registry,
    stack: str,
    content_hash: str | None = None,
    *,
    reference: str | None = None,
    allow_unsigned: bool = False,
    store: ArtifactStore | None = None,
    tool: str = "sm120-stacks",
) -> Relied:
    """The image's evidence under the hosts folder's policy, or trusted on first use where
    there is none. A bad trust.yaml is refused (exit 2, file/key/line) before the registry is
    read; a refusal writes nothing."""
    policy = host_policy(hosts_dir)
    if policy is not None:
        evidence = read_evidence(
            registry,
            stack,
            content_hash,
            reference=reference,
            trust=policy,
            allow_unsigned=allow_unsigned,
            store=store,
        )
        _fresh(hosts_dir, evidence)
        return Relied(evidence, policy, _ignored(evidence))
    store = store or ArtifactStore(registry)
    tag = reference or (content_tag(stack, content_hash) if content_hash else stack)
    learned = learn(store, tag, policy_path(hosts_dir))
    evidence = read_evidence(
        registry,
        stack,
        content_hash,
        reference=reference,
        trust=learned.policy(),
        allow_unsigned=allow_unsigned,
        store=store,
    )
    refuse_rollback(hosts_dir, evidence.ref, evidence.index_version)
    said = write_learned(learned, evidence.signed_by, tool)
    remember(hosts_dir, evidence.ref, evidence.index_version)
    if not said:
        said = [
            f"no trust policy ({policy_path(hosts_dir)}) and no signed evidence: relied on "
            "unsigned documents (--allow-unsigned); no key was trusted"
        ]
    said += _ignored(evidence)
    return Relied(evidence, learned.policy(), said, first_use=bool(evidence.signed_by))


def _fresh(hosts_dir: Path, evidence: Evidence) -> None:
    """Freshness (the TUF snapshot idea, evidence/index.py): an index older than the newest
    this hosts folder relied on for the image, or none where one was, is a rollback and
    refused; a newer one is remembered."""
    refuse_rollback(hosts_dir, evidence.ref, evidence.index_version)
    remember(hosts_dir, evidence.ref, evidence.index_version)


def _ignored(evidence: Evidence) -> list[str]:
    """The unsigned extras beside signed evidence, and what its signed index does not list,
    named (a registry writer's, most likely)."""
    said = []
    if evidence.ignored:
        said.append(
            f"ignored {len(evidence.ignored)} unsigned document(s) beside the signed evidence "
            f"of {evidence.digest[:19]} (not relied on): {', '.join(evidence.ignored)}"
        )
    if evidence.unlisted:
        said.append(
            f"ignored {len(evidence.unlisted)} document(s) that the signed index (version "
            f"{evidence.index_version}) of {evidence.digest[:19]} does not list, or indexes "
            f"no trusted key signed (not relied on): {', '.join(evidence.unlisted)}"
        )
    return said


__all__ = ["Relied", "relied_evidence"]
