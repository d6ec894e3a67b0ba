"""The base digests of a proposal's lock: the parent's where the base reference is unchanged.

A proposal moves Python pins; its base images are the parent's. On a machine with no registry
the lock `propose` makes could not pin them (lockfile.UNPINNED), and `check` and builds refuse
a base that follows its tag, so the upstream loop's first step did not check. The parent's lock
already pins those very images (with the note that says how, e.g. "not verified from this
machine"), and a proposal is meant to differ from its parent only in what moved, so its digest
and note are carried over. A base that differs from the parent's, or that the parent's lock does
not pin, keeps what the registry gave; unpinned, the proposal says so and names the command
that pins it.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.lock.inputs import original_bases
from builder.lock.locked import lock_stack
from builder.lock.lockfile import UNPINNED, Lock, LockedBase, LockedBases
from builder.manifest.resolve import ResolvedStack

ROLES = ("build", "runtime")


@dataclass(frozen=True)
class ProposedBase:
    """One base of the proposal's lock and where its digest came from."""

    role: str
    image: str
    digest: str | None
    #: "parent" (carried from the parent's lock), "lock" (as the lock was made: the manifest's
    #: digest or the registry's answer), or "unpinned".
    source: str
    note: str
    #: What the proposal says about it (a changed or unpinned base); None when carried quietly.
    said: str | None = None
    #: The command that pins an unpinned base where its registry answers.
    pin_command: str | None = None


def carry_bases(
    name: str, stack: ResolvedStack, made: Lock, parent: ResolvedStack
) -> tuple[Lock, list[ProposedBase]]:
    """The lock with the parent's pinned bases where the proposal's base reference is the
    parent's, and what became of each base (build, runtime)."""
    parent_lock = lock_stack(parent).lock  # None: no lock, or a stale one
    ours, theirs = original_bases(stack), original_bases(parent)
    bases: dict[str, LockedBase] = {}
    told: list[ProposedBase] = []
    for role in ROLES:
        fresh: LockedBase = getattr(made.bases, role)
        kept: LockedBase | None = getattr(parent_lock.bases, role) if parent_lock else None
        if ours[role] == theirs[role] and kept is not None and kept.digest is not None:
            bases[role] = kept
            told.append(_carried(name, role, parent.name, kept, fresh))
            continue
        bases[role] = fresh
        why = _not_carried(parent.name, ours[role], theirs[role], parent_lock)
        told.append(_as_made(name, role, fresh, why))
    return made.model_copy(update={"bases": LockedBases(**bases)}), told


def _carried(
    name: str, role: str, parent: str, kept: LockedBase, fresh: LockedBase
) -> ProposedBase:
    """The parent's digest; said only when the registry now gives another for the same tag."""
    said = None
    if fresh.digest is not None and fresh.digest != kept.digest:
        said = (
            f"{role} base {kept.image}: kept {parent}'s {kept.digest}, though its registry now "
            f"gives {fresh.digest} (`sm120-stacks lock {name} --refresh-bases` moves to it)"
        )
    return ProposedBase(role, kept.image, kept.digest, "parent", kept.note, said)


def _not_carried(
    parent: str,
    ours: tuple[str, str | None],
    theirs: tuple[str, str | None],
    parent_lock: Lock | None,
) -> str:
    """Why the parent's digest was not carried over, as the proposal says it."""
    if ours != theirs:
        return f"it differs from {parent}'s {_reference(theirs)}"
    if parent_lock is None:
        return f"{parent} has no current lock to carry its digest from"
    return f"{parent}'s lock does not pin it either"


def _as_made(name: str, role: str, fresh: LockedBase, why: str) -> ProposedBase:
    """The base as the lock was made; said when it changed or is not pinned."""
    if fresh.digest is not None:
        said = None
        if why.startswith("it differs"):
            said = f"{role} base {fresh.image}: {why}; pinned at {fresh.digest} ({fresh.note})"
        return ProposedBase(role, fresh.image, fresh.digest, "lock", fresh.note, said)
    command = f"sm120-stacks lock {name} --refresh-bases"
    said = (
        f"{role} base {fresh.image} is NOT pinned by digest: {why}, and "
        f"{fresh.note.removeprefix(UNPINNED)}; `{command}` pins it where its registry answers "
        "(`check` and builds refuse it until then)"
    )
    return ProposedBase(role, fresh.image, None, "unpinned", fresh.note, said, command)


def _reference(base: tuple[str, str | None]) -> str:
    image, digest = base
    return f"{image}@{digest}" if digest else image
