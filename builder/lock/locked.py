"""A resolved stack with its lock read once: the value a command hands to render and build.

Before this, `build` asked lock/ for the same file five times (its versions for the rules, its
floating bases, the lock again for the context, each base's reference, its requirements). Now
the CLI makes one LockedStack and every later step reads its fields: nothing below climbs back
up to ask the lock again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.errors import StackError
from builder.lock.inputs import base_reference, floating_bases, lock_path, stale_reason
from builder.lock.lockfile import Lock
from builder.lock.reading import inherited_lock, packages_base_lock, read_lock
from builder.manifest.resolve import ResolvedStack


@dataclass(frozen=True)
class LockedStack:
    """The stack, the lock a build installs from (None: no lock file), and what follows from
    the two: the FROM of each stage, the roles whose base follows a tag, the versions the
    compatibility rules judge."""

    stack: ResolvedStack
    lock: Lock | None
    #: stacks/NAME.lock, whether or not it exists: where a stale or floating lock is fixed; for
    #: a serve-only child without one, the parent's lock it builds on (reading.inherited_lock).
    path: Path
    #: What FROM uses in the build and runtime stages (lockfile.base_reference).
    build_base: str
    runtime_base: str
    #: Roles ("build", "runtime") whose FROM follows a tag (lockfile.floating_bases).
    floating: tuple[str, ...]
    #: name -> version the lock installs; None without a lock or with a stale one.
    versions: dict[str, str] | None
    #: Why the lock no longer matches the manifest, as the error a build raises; None when it
    #: matches or there is none. Rules still run first (`check` reports both).
    stale: StackError | None = None
    #: The lock whose package set the packages stage installs first (reading.packages_base_lock):
    #: an ancestor's, shared with its image and its other children, or the lock itself; None
    #: without a usable lock.
    packages_base: Lock | None = None

    @property
    def name(self) -> str:
        return self.stack.name


def lock_stack(stack: ResolvedStack) -> LockedStack:
    """Read the stack's lock once and derive everything later steps ask of it. A stale lock
    is kept as `stale` (not raised) so that the rules can be judged first; a command that
    builds raises it then (cli.app.Settings.locked)."""
    path = lock_path(stack)
    lock = read_lock(path) if path.is_file() else None
    reason = stale_reason(stack, lock) if lock is not None else None
    inherited = inherited_lock(stack) if lock is None else None
    if inherited is not None:  # a serve-only child: its parent's lock is its own
        path, lock = inherited
    stale = None
    if reason is not None:
        stale = StackError(
            f"lock no longer matches stacks/{stack.name}.yaml: {reason}",
            file=path,
            key="inputs_hash",
            hint=f"run `sm120-stacks lock {stack.name}`, or delete the lock to build without one",
        )
    usable = None if stale is not None else lock
    return LockedStack(
        stack=stack,
        lock=usable,
        path=path,
        build_base=base_reference(stack, usable, "build"),
        runtime_base=base_reference(stack, usable, "runtime"),
        floating=tuple(floating_bases(stack, usable)),
        versions=usable.python.versions() if usable is not None else None,
        stale=stale,
        packages_base=packages_base_lock(stack, usable) if usable is not None else None,
    )


def require_pinned_bases(locked: LockedStack, allow: bool) -> list[str]:
    """A real stack builds FROM bases pinned by digest (its lock pins them): a base that
    follows its tag is refused unless allowed (--allow-floating-base); the roles floating."""
    floating, stack = list(locked.floating), locked.stack
    if floating and not allow:
        role = floating[0]
        image = getattr(stack.manifest.bases, role).image
        if not locked.path.is_file():  # `check` before the first `lock`: say what is missing
            raise StackError(
                f"{stack.name} has no lock yet, so its {role} base {image} is not pinned by "
                "digest",
                file=locked.path,
                hint=f"run `sm120-stacks lock {stack.name}` (it pins the bases where their "
                "registry answers), or pass --allow-floating-base",
            )
        raise StackError(
            f"the {role} base {image} is not pinned by digest: the image would follow "
            "whatever its tag points to the day it is built",
            file=locked.path,
            key=f"bases.{role}.digest",
            hint=f"`sm120-stacks lock {stack.name} --refresh-bases` where its registry answers "
            "(or `lock` it), or pass --allow-floating-base (recorded in its evidence)",
        )
    return floating
