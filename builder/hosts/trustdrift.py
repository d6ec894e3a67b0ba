"""What `drift` says of a pin's evidence under the hosts' trust policy (issue 35).

A pin remembers the key ids its registry evidence was signed with, and whether it was made
with --allow-unsigned. A pin made unsigned is a drift named `unsigned` (migration only); a
pin whose evidence rested on a key that is no longer in trust.yaml is a drift named
`revoked`, naming the key: the key was rotated out or taken away, and the pin should be made
again from evidence signed by a key the policy still trusts.
"""

from __future__ import annotations

from pathlib import Path

from builder.errors import StackError
from builder.evidence.trust import TrustPolicy, host_policy, policy_path
from builder.hosts.drift import Drift
from builder.hosts.evidence_gate import reverify
from builder.hosts.pins import Pin


def trust_drifts(pin: Pin, policy: TrustPolicy | None) -> list[Drift]:
    drifts = []
    if pin.allow_unsigned:
        drifts.append(
            Drift(
                "unsigned",
                "pinned with --allow-unsigned: its evidence was relied on without a signature "
                "the trust policy accepts",
            )
        )
    if policy is None:
        return drifts
    trusted = {key.key_id for key in policy.keys.values()}
    for key_id in pin.evidence_keys:
        if key_id not in trusted:
            drifts.append(
                Drift(
                    "revoked",
                    f"its evidence rested on key {key_id[:16]}, which {policy.path.name} no "
                    "longer names: pin it again from evidence signed by a trusted key",
                )
            )
    return drifts


def evidence_drifts(pin: Pin, policy: TrustPolicy | None) -> list[Drift]:
    """The pinned digest's evidence re-verified under the current policy, every time (issue
    43): a drift named `evidence` with why and what to do. Without a policy nothing is read
    (drift writes nothing, so it does not trust on first use; deploy --apply does)."""
    if policy is None:
        return []
    why = reverify(pin, policy)
    if why is None:
        return []
    return [
        Drift(
            "evidence",
            f"{why}; deploy --apply would refuse it: pin {pin.host} again from evidence "
            f"signed by keys {policy.path.name} names for it (or fix {policy.path.name})",
        )
    ]


def refuse_revoked(pins: list[Pin], policy: TrustPolicy | None) -> None:
    """deploy --apply starts nothing on evidence the policy no longer trusts: every pin whose
    key was taken out of trust.yaml is named, before any container or volume is touched."""
    if policy is None:
        return
    revoked = [
        f"{pin.host}: {drift.detail}"
        for pin in pins
        for drift in trust_drifts(pin, policy)
        if drift.name == "revoked"
    ]
    if revoked:
        raise StackError(
            "refusing to deploy pins whose evidence rests on a revoked key:\n  "
            + "\n  ".join(revoked),
            file=policy.path,
            hint="pin each host again (`sm120-stacks pin HOST STACK --registry R`) once its "
            "evidence is signed by a key the policy names",
        )


def refuse_ungated(pin: Pin, hosts_dir: Path) -> None:
    """`cache capture/list/prove` work on the pinned image's caches: only once its evidence
    passed the current policy (issue 43), before the engine is asked for anything, so no
    cache of an image the policy refuses is read, listed as restorable or captured (and
    signed). Exit 2 otherwise. (The volume itself is read by the tool's own helper image,
    warm/helper.py: no code of the pinned image runs either way.)"""
    policy = host_policy(hosts_dir)
    if policy is None:
        raise StackError(
            f"{pin.host}: no trust policy ({policy_path(hosts_dir)}): the evidence of "
            f"{pin.image} is not verified here, so its caches are not read",
            hint=f"`sm120-stacks deploy {pin.host} --apply` trusts its signer on first use "
            "(or write trust.yaml: docs/evidence.md), then run this again",
        )
    why = reverify(pin, policy)
    if why is not None:
        raise StackError(
            f"{pin.host}: {pin.image} fails the trust policy ({why}): none of its code runs "
            "here, nothing was read",
            file=policy.path,
            hint=f"pin {pin.host} again from evidence signed by keys {policy.path.name} names",
        )
