"""deploy --apply's first gate: the pinned digest's evidence, read again from the registry and
verified under this hosts folder's trust policy, before anything is pulled or replaced.

`pin` checks signatures when it reads evidence from the registry, but a pin may have been
written on a machine with a looser policy or none (or from a build folder's record, which
reads no signature), and the registry's evidence may have changed since. So `deploy --apply`
reads the evidence of each pin's image again (evidence/reader.py, under HOSTS_DIR/trust.yaml):
every document must be signed by a key the policy names for its purpose (evidence/vouching.py),
the verdict must be of the pin's stack and content hash with its static verdict passed, and
the served verdict the pin relies on (`served_on`) must pass and is vouched for by a key
trusted for `served` on that GPU kind. Any refusal stops the whole deploy, every host
untouched, with the document, the key and what to do; what passes is said with the keys
that vouched. A pin made with --allow-unsigned is let through on its unsigned documents (and
said so; `drift` reports it). Without a policy the keys that signed the first pin's evidence
are trusted on first use and written to trust.yaml (evidence/decision.py), and every later
pin is read under it: there is no unverified path.
"""

from __future__ import annotations

from pathlib import Path

from builder.errors import EngineError, OperationFailed, StackError
from builder.evidence.decision import Relied, relied_evidence
from builder.evidence.oci import ArtifactStore
from builder.evidence.reader import read_evidence
from builder.evidence.trust import TrustPolicy, host_policy, policy_path
from builder.hosts.pins import Pin


def vouch_for_deploy(pins: list[Pin], hosts_dir: Path) -> tuple[list[str], TrustPolicy | None]:
    """Lines saying who vouched for each pin's image, and the policy they were read under
    (learned on first use where the folder had none; None only for no pins); StackError (exit
    2) at the first pin whose evidence the policy does not accept, before any host is
    touched."""
    lines: list[str] = []
    policy = host_policy(hosts_dir)
    for pin in pins:
        relied = _read(pin, hosts_dir)
        policy = relied.policy
        lines += relied.said
        _require_verdicts(pin, policy, relied)
        lines.append(_vouched_line(pin, relied))
    return lines, policy


def _vouched_line(pin: Pin, relied: Relied) -> str:
    evidence, policy = relied.evidence, relied.policy
    names = [f"{policy.name_of(k) or 'key'} ({k[:16]})" for k in evidence.signed_by]
    line = (
        f"{pin.host}: evidence of {pin.image.rpartition('@')[2][:19]} vouched for by "
        f"{', '.join(names) or 'no key'} ({policy.path.name})"
    )
    if evidence.unsigned:
        line += (
            f"; {len(evidence.unsigned)} unsigned document(s) let through: pinned with "
            "--allow-unsigned (drift reports it)"
        )
    return line


def _read(pin: Pin, hosts_dir: Path) -> Relied:
    digest = pin.image.rpartition("@")[2]
    where = policy_path(hosts_dir)
    try:
        store = ArtifactStore.of_image(pin.image)
        return relied_evidence(
            hosts_dir,
            store.registry,
            pin.stack,
            pin.content_hash,
            reference=digest,
            allow_unsigned=pin.allow_unsigned,
            store=store,
            tool="deploy --apply",
        )
    except StackError as exc:  # Untrusted, refused or missing evidence
        raise _refused(pin, where, exc.message) from None
    except (OperationFailed, EngineError) as exc:  # the registry not reached
        raise _refused(pin, where, f"its evidence could not be read: {exc}") from None


def reverify(pin: Pin, policy: TrustPolicy) -> str | None:
    """drift's check, every time: the pinned digest's evidence read again under the current
    policy (unsigned, revoked, a key no longer trusted for what it signed, a verdict gone or
    failed); why it no longer holds, or None. Writes nothing (no first use here)."""
    digest = pin.image.rpartition("@")[2]
    try:
        store = ArtifactStore.of_image(pin.image)
        evidence = read_evidence(
            store.registry,
            pin.stack,
            pin.content_hash,
            reference=digest,
            trust=policy,
            allow_unsigned=pin.allow_unsigned,
            store=store,
        )
        _require_verdicts(pin, policy, Relied(evidence, policy))
    except StackError as exc:
        return exc.message.removeprefix(f"{pin.host}: refusing to deploy {pin.image}: ")
    except (OperationFailed, EngineError) as exc:
        return f"its evidence could not be read: {exc}"
    return None


def _require_verdicts(pin: Pin, policy: TrustPolicy, relied: Relied) -> None:
    """The signed evidence still says what the pin relied on."""
    evidence = relied.evidence
    if evidence.stack != pin.stack:
        raise _refused(
            pin, policy.path, f"its verdict is of stack {evidence.stack}, not {pin.stack}"
        )
    if evidence.verdicts.static != "passed":
        raise _refused(pin, policy.path, f"its static verdict is {evidence.verdicts.static}")
    if pin.served_on is None:
        return
    served = evidence.verdicts.served_on(pin.served_on)
    if served is None or not served.passed:
        state = "no served verdict" if served is None else "a failed served verdict"
        raise _refused(pin, policy.path, f"its signed evidence holds {state} on {pin.served_on}")


def _refused(pin: Pin, where: Path, why: str) -> StackError:
    return StackError(
        f"{pin.host}: refusing to deploy {pin.image}: {why}",
        file=where,
        hint="nothing was pulled, stopped or started; its evidence must be signed by keys "
        f"{where.name} names for it (push --signing-key FILE with a build key, smoke "
        "--record --signing-key FILE with an operator key trusted for the GPU kind), then "
        f"pin {pin.host} again",
    )
