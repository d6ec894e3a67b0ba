"""Locks for tests, made without a resolution: the inputs of the stack as it is now (so the lock
is fresh), the packages given, and a base that says it came from a test."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from builder.lock.inputs import inputs_hash, lock_inputs
from builder.lock.lockfile import (
    LOCK_SCHEMA,
    Lock,
    LockedBase,
    LockedBases,
    LockedPackage,
    LockedPython,
)
from builder.manifest.resolve import ResolvedStack

ZERO_HASH = "sha256:" + "0" * 64
#: The digest a test lock pins its bases at (as a real stack's lock does).
BASE_DIGEST = "sha256:" + "5d" * 32


def packages_of(versions: Mapping[str, str]) -> dict[str, LockedPackage]:
    """One package per name at that version, with a placeholder hash."""
    return {n: LockedPackage(version=v, hashes=[ZERO_HASH]) for n, v in versions.items()}


def lock_of(
    stack: ResolvedStack,
    packages: Mapping[str, LockedPackage],
    *,
    heavy: Iterable[str] = (),
    base: LockedBase | None = None,
    resolver: str = "test",
) -> Lock:
    """A fresh lock of stack holding packages; the names in heavy go to the heavy layer."""
    inputs = lock_inputs(stack)
    base = base or LockedBase(
        image=stack.manifest.bases.build.image, digest=BASE_DIGEST, note="test"
    )
    heavy = set(heavy)
    return Lock(
        schema_version=LOCK_SCHEMA,
        stack=stack.name,
        inputs_hash=inputs_hash(inputs),
        inputs=inputs,
        bases=LockedBases(build=base, runtime=base),
        python=LockedPython(
            version="3.12",
            platform="x86_64-manylinux_2_28",
            resolver=resolver,
            index_url=stack.manifest.python.index_url,
            heavy={k: v for k, v in packages.items() if k in heavy},
            packages={k: v for k, v in packages.items() if k not in heavy},
        ),
    )
