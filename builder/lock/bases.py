"""The base images' digests, asked of their registries through the engine: when a lock is made
(resolve_base) and when only the bases are asked again (`lock --refresh-bases`).
"""

from __future__ import annotations

from builder.engine.protocol import Engine
from builder.errors import (
    EngineError,
    EngineNotFound,
    EngineUnreachable,
    RegistryUnreachable,
    StackError,
)
from builder.lock.lockfile import UNPINNED, Lock, LockedBase, LockedBases
from builder.manifest.resolve import ResolvedStack


def refresh_bases(
    stack: ResolvedStack, lock: Lock, engine: Engine | None
) -> tuple[Lock, list[str]]:
    """The lock with each base's digest asked of its registry again (no package resolution):
    a digest the registry gives replaces the locked one (said, with both); a registry that
    cannot be reached leaves the locked digest as it was (said too)."""
    said: list[str] = []
    bases = {}
    for role in ("build", "runtime"):
        locked: LockedBase = getattr(lock.bases, role)
        asked = resolve_base(locked.image, None, engine)
        if asked.digest is None:
            said.append(f"{role} base {locked.image}: not verified ({asked.note}); kept")
            bases[role] = locked
        elif asked.digest == locked.digest:
            said.append(f"{role} base {locked.image}: verified, {asked.digest}")
            bases[role] = asked
        else:
            said.append(f"{role} base {locked.image}: {locked.digest} -> {asked.digest}")
            bases[role] = asked
    refreshed = lock.model_copy(update={"bases": LockedBases(**bases)})
    return refreshed, said


def resolve_base(image: str, digest: str | None, engine: Engine | None) -> LockedBase:
    """The registry's digest for image. Without an engine, or when the registry cannot be
    reached at all, the image as given, its note saying so; any other failure (authentication,
    no such image or tag) is a StackError naming the image."""
    if digest:
        return LockedBase(image=image, digest=digest, note="digest pinned in the manifest")
    if engine is None:
        return LockedBase(image=image, note=UNPINNED + "no Docker engine to ask a registry")
    try:
        found = engine.registry_digest(image)
    except RegistryUnreachable as exc:
        reason = _reason(exc)
        return LockedBase(image=image, note=f"{UNPINNED}registry not reachable ({reason})")
    except EngineUnreachable as exc:
        return LockedBase(image=image, note=f"{UNPINNED}engine not reachable ({_reason(exc)})")
    except EngineNotFound as exc:
        raise StackError(
            f"base image {image}: the registry has no such image or tag ({_reason(exc)})",
            hint="check the image name and tag in the manifest's bases; no lock was written",
        ) from None
    except EngineError as exc:
        reason = _reason(exc)
        raise StackError(
            f"base image {image}: the registry refused to give its digest ({reason})",
            hint="log in to that registry (`docker login HOST`) or check the image name; "
            "no lock was written",
        ) from None
    return LockedBase(image=image, digest=found, note="digest resolved from the registry")


def _reason(exc: EngineError) -> str:
    return " ".join(exc.explanation.split())[:300]
