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
said so; `drift` reports it). Without a policy nothing is verified, and the output says so.
"""

from __future__ import annotations

from pathlib import Path

from builder.errors import EngineError, OperationFailed, StackError
from builder.evidence.oci import ArtifactStore
from builder.evidence.reader import Evidence, read_evidence
from builder.evidence.trust import POLICY_FILE, TrustPolicy
from builder.hosts.pins import Pin


def vouch_for_deploy(pins: list[Pin], policy: TrustPolicy | None, hosts_dir: Path) -> list[str]:
    """A line per pin saying who vouched for its image; StackError (exit 2) at the first pin
    whose evidence the policy does not accept, before any host is touched."""
    if policy is None:
        return [
            f"{pin.host}: no trust policy ({hosts_dir / POLICY_FILE}): the evidence of "
            f"{pin.image} was not verified"
            for pin in pins
        ]
    return [_vouched_line(pin, policy) for pin in pins]


def _vouched_line(pin: Pin, policy: TrustPolicy) -> str:
    evidence = _read(pin, policy)
    _require_verdicts(pin, policy, evidence)
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


def _read(pin: Pin, policy: TrustPolicy) -> Evidence:
    digest = pin.image.rpartition("@")[2]
    try:
        store = ArtifactStore.of_image(pin.image)
        return read_evidence(
            store.registry,
            pin.stack,
            pin.content_hash,
            reference=digest,
            trust=policy,
            allow_unsigned=pin.allow_unsigned,
            store=store,
        )
    except StackError as exc:  # Untrusted, refused or missing evidence
        raise _refused(pin, policy, exc.message) from None
    except (OperationFailed, EngineError) as exc:  # the registry not reached
        raise _refused(pin, policy, f"its evidence could not be read: {exc}") from None


def _require_verdicts(pin: Pin, policy: TrustPolicy, evidence: Evidence) -> None:
    """The signed evidence still says what the pin relied on."""
    if evidence.stack != pin.stack:
        raise _refused(pin, policy, f"its verdict is of stack {evidence.stack}, not {pin.stack}")
    if evidence.verdicts.static != "passed":
        raise _refused(pin, policy, f"its static verdict is {evidence.verdicts.static}")
    if pin.served_on is None:
        return
    served = evidence.verdicts.served_on(pin.served_on)
    if served is None or not served.passed:
        state = "no served verdict" if served is None else "a failed served verdict"
        raise _refused(pin, policy, f"its signed evidence holds {state} on {pin.served_on}")


def _refused(pin: Pin, policy: TrustPolicy, why: str) -> StackError:
    return StackError(
        f"{pin.host}: refusing to deploy {pin.image}: {why}",
        file=policy.path,
        hint="nothing was pulled, stopped or started; its evidence must be signed by keys "
        f"{policy.path.name} names for it (push --signing-key FILE with a build key, smoke "
        "--record --signing-key FILE with an operator key trusted for the GPU kind), then "
        f"pin {pin.host} again",
    )
