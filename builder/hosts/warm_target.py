"""A pin's warm caches: the pin seen as builder.warm's target, restored before each start,
proved after each start (builder/warm/lifecycle.py says how).

Kept apart from deploy.py so that rendering a pin's files never needs a registry: only a
deploy that starts a container, `cache capture` and `drift` reach for the artifacts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from builder.engine.hostprobe import HostFacts, gather
from builder.engine.protocol import Engine
from builder.errors import OperationFailed, StackError, ToolMissing
from builder.evidence.keys import SigningKey
from builder.evidence.oci import ArtifactStore
from builder.evidence.trust import TrustPolicy
from builder.hosts import remote
from builder.hosts.container import volumes
from builder.hosts.pins import Pin
from builder.knowledge.cache_volume import cache_volume
from builder.warm import artifact
from builder.warm.archive import CapturedFile
from builder.warm.artifact import Found
from builder.warm.key import WarmKey
from builder.warm.lifecycle import (
    Proof,
    RestoreResult,
    WarmTarget,
    capture,
    host_key,
    live_refusal,
    prove,
    purge_refused,
    restore,
)
from builder.warm.ranks import held_ranks, missing_ranks
from builder.warm.volume import open_volume


def target_of(pin: Pin) -> WarmTarget | None:
    """The pin's cache volume and what its caches depend on; None: the pin mounts no cache
    volume at the layout's path (a CPU stack pinned without one, a pin of an older tool)."""
    mounts = volumes(pin)
    layout = cache_volume()
    volume = next((m.source for m in mounts if m.target == layout.mount), None)
    if volume is None:
        return None
    return WarmTarget(
        host=pin.host,
        image=pin.image,
        volume=volume,
        command=tuple(pin.command),
        env=dict(pin.env),
        gpu_indices=pin.gpu_indices,
        read_only_mounts=tuple((m.source, m.target) for m in mounts if m.read_only),
    )


def require_target(pin: Pin) -> WarmTarget:
    target = target_of(pin)
    if target is None:
        raise StackError(
            f"the pin of {pin.host} mounts no cache volume at {cache_volume().mount}",
            key="volumes",
            hint=f"pin it again (a vLLM stack gets one), or with --volume "
            f"NAME:{cache_volume().mount}",
        )
    return target


def host_facts(pin: Pin, engine: Engine, default: str | None) -> HostFacts:
    """The GPUs and driver of the pin's host (none asked when the pin gives it no GPU)."""
    if pin.gpus == "none":
        return HostFacts(None, (), "the pin gives the container no GPU", (), None)
    return gather(engine, None, remote.probe(pin, default))


@dataclass(frozen=True)
class WarmPolicy:
    """How deploy treats warm caches: restore before a start unless `cold`; `require` refuses
    a start without an exact artifact, and fails the gate on any compile."""

    require: bool = False
    cold: bool = False
    default_engine: str | None = None
    #: The hosts' trust policy: only artifacts a key it trusts for warm caches of the host's
    #: GPU kind signed are restored. None: the hosts folder has none (nothing is verified).
    trust: TrustPolicy | None = None

    def __post_init__(self) -> None:
        if self.require and self.cold:
            raise StackError("--require-warm and --cold ask for opposite things", key="--cold")


def restorer(policy: WarmPolicy) -> Callable[[Pin, Engine], str | None]:
    """The step deploy runs between removing the old container and starting the new one."""

    def before_start(pin: Pin, engine: Engine) -> str | None:
        if policy.cold:
            target = target_of(pin)
            if policy.trust is None or target is None:
                return None
            store = ArtifactStore.of_image(pin.image)
            return purge_refused(engine, store, target, policy.trust)
        target = require_target(pin) if policy.require else target_of(pin)
        if target is None:
            return None
        try:
            facts = host_facts(pin, engine, policy.default_engine)
            store = ArtifactStore.of_image(pin.image)
            result = restore(
                engine, store, target, facts, require_warm=policy.require, trust=policy.trust
            )
        except (ToolMissing, OperationFailed) as exc:
            if policy.require:
                raise
            return f"no warm cache ({exc}): a cold start"
        return describe_restore(result)

    return before_start


def live_checker(policy: WarmPolicy) -> Callable[[Pin, Engine], str | None]:
    """deploy's question for a host already running as pinned: must it restart because its
    cache volume holds a warm cache the trust policy refuses (restored before the policy was
    added, or unsigned)? Its restart runs before_start, which empties live/ first."""

    def must_restart(pin: Pin, engine: Engine) -> str | None:
        target = target_of(pin)
        if policy.trust is None or target is None:
            return None
        why = live_refusal(engine, ArtifactStore.of_image(pin.image), target, policy.trust)
        if why is None:
            return None
        return f"its cache volume holds what the trust policy refuses ({why}): restarting"

    return must_restart


def describe_restore(result: RestoreResult) -> str:
    lines = [f"recovered: {result.recovered}"] if result.recovered else []
    lines += [result.detail, *(f"  {difference}" for difference in result.differences)]
    return "\n".join(lines)


def proof_of(pin: Pin, engine: Engine) -> Proof | None:
    target = target_of(pin)
    return None if target is None else prove(engine, target)


def warm_summary(pin: Pin, engine: Engine) -> str | None:
    """drift's words for the running server's start: warm or cold, and what it compiled."""
    try:
        proof = proof_of(pin, engine)
    except (StackError, OperationFailed) as exc:
        return f"unknown ({str(exc)[:120]})"
    return None if proof is None else proof.summary()


def capture_pin(
    pin: Pin, engine: Engine, default: str | None, signer: SigningKey | None = None
) -> str:
    target = require_target(pin)
    facts = host_facts(pin, engine, default)
    store = ArtifactStore.of_image(pin.image)
    digest, key, files = capture(engine, store, target, facts, signer)
    size = sum(f.size for f in files)
    kinds: dict[str, int] = {}
    for f in files:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    listed = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
    gpu = ", ".join(key.gpus) or "no GPU"
    return (
        f"captured {len(files)} files ({size / 1e6:.1f} MB: {listed}) from {target.volume} on "
        f"{pin.host} as {digest[:19]}, beside {pin.image}\n"
        f"key {key.digest()[:19]}: {gpu}, driver {key.driver or 'none'}, model {key.model}, "
        f"TP {key.tensor_parallel} x PP {key.pipeline_parallel}, mounted at {key.mount}"
        + _ranks_line(key, files)
        + (
            f"\nsigned by key {signer.key_id[:16]}"
            if signer is not None
            else "\nunsigned: a host with a trust policy will not restore it (--signing-key)"
        )
    )


def _ranks_line(key: WarmKey, files: list[CapturedFile]) -> str:
    """Which workers' torch.compile folders the capture holds, where it holds any; those of
    the parallel shape it lacks compile at every restored start."""
    held = held_ranks(f.path for f in files)
    if not held:
        return ""
    line = f"\nranks: {' '.join(r.folder for r in held)}"
    missing = missing_ranks(key.tensor_parallel, key.pipeline_parallel, held)
    if missing:
        line += f" (lacks {', '.join(missing)}: those workers compile after a restore)"
    return line


@dataclass(frozen=True)
class Candidate:
    """A warm-cache artifact of the pin's image, against the host's own key."""

    found: Found
    differences: list[str]

    @property
    def match(self) -> bool:
        return not self.differences


def candidates(pin: Pin, engine: Engine, default: str | None) -> tuple[WarmKey, list[Candidate]]:
    """The host's key and every artifact of its image, newest first."""
    target = require_target(pin)
    facts = host_facts(pin, engine, default)
    layout = cache_volume()
    mounts = list(target.read_only_mounts)
    with open_volume(engine, target.volume, layout, mounts) as access:
        key = host_key(target, facts, access)
    found = artifact.find(ArtifactStore.of_image(pin.image), target.image_digest)
    return key, [Candidate(f, key.differences(f.key)) for f in found]
