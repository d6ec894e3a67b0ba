"""What a lock is made from and how it matches its manifest: the inputs it records (platform,
bases as the manifest wrote them, the python section, local wheels' bytes), their hash, why a
lock is stale, and what FROM each stage uses with or without a lock.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from builder.lock.lockfile import LOCK_SCHEMA, Lock
from builder.manifest.resolve import ResolvedStack, canonical_json, local_wheels


def lock_path(stack: ResolvedStack) -> Path:
    """stacks/NAME.lock, beside the stack's own manifest."""
    return stack.sources[0].with_name(f"{stack.name}.lock")


def lock_inputs(stack: ResolvedStack) -> dict[str, Any]:
    """What a lock depends on: platform, bases, the python section and the local wheels' bytes.

    Serve settings, env or JIT modules are left out on purpose: changing them needs no new lock.
    """
    m = stack.manifest
    wheels = {
        path.name: "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
        for path in local_wheels(stack)
    }
    bases = original_bases(stack)
    return {
        "lock_schema": LOCK_SCHEMA,
        "platform": m.platform,
        "bases": {
            role: {"image": image, "digest": digest} for role, (image, digest) in bases.items()
        },
        "python": m.python.model_dump(mode="json"),
        "wheel_files": wheels,
    }


def original_bases(stack: ResolvedStack) -> dict[str, tuple[str, str | None]]:
    """role -> (image, digest) as the manifest wrote them, before any site substitution.

    A lock pins the manifest's bases; a site that builds FROM a mirror (--substitute-base)
    uses the same lock, and its substitute wins over the locked digest. resolve() keeps the
    written bases (ResolvedStack.written_bases), so nothing here undoes a substitution.
    """
    written = stack.written_bases
    return {
        role: (base.image, base.digest)
        for role, base in (("build", written.build), ("runtime", written.runtime))
    }


def base_reference(stack: ResolvedStack, lock: Lock | None, role: str) -> str:
    """What FROM uses: a substituted base as substituted, else the locked digest, else the
    manifest's reference."""
    base = getattr(stack.manifest.bases, role)
    if lock is None or base.reference in _substitutions(stack).values():
        return str(base.reference)
    return str(getattr(lock.bases, role).reference)


#: Base images made on the build machine (`make base-local`, `make base-cuda-local`): no
#: registry holds them, so no digest can pin them; the image IDs the build records do.
LOCAL_BASE_PREFIX = "local/"


def floating_bases(stack: ResolvedStack, lock: Lock | None) -> list[str]:
    """The roles whose FROM follows a tag: a registry image with no digest in the lock or the
    manifest. A substituted base (a site's mirror or local image) and a local base are the
    site's own choice and not counted."""
    floating = []
    for role in ("build", "runtime"):
        reference = base_reference(stack, lock, role)
        base = getattr(stack.manifest.bases, role)
        substituted = base.reference in _substitutions(stack).values()
        local = reference.startswith(LOCAL_BASE_PREFIX)
        if "@sha256:" not in reference and not substituted and not local:
            floating.append(role)
    return floating


def _substitutions(stack: ResolvedStack) -> dict[str, str]:
    return stack.base_substitutions


def inputs_hash(inputs: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(inputs).encode()).hexdigest()


def stale_reason(stack: ResolvedStack, lock: Lock) -> str | None:
    """Why the lock does not match the manifest now (None when it does)."""
    current = lock_inputs(stack)
    if inputs_hash(lock.inputs) != lock.inputs_hash:
        return "its recorded inputs do not match its inputs_hash (edited by hand?)"
    if lock.stack == stack.name and inputs_hash(current) == lock.inputs_hash:
        return None
    if lock.stack != stack.name:
        return f"it was made for stack {lock.stack!r}"
    was, now = flatten(lock.inputs), flatten(current)
    changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
    if not changed:
        return "its inputs_hash does not match its recorded inputs (edited by hand?)"
    shown = ", ".join(
        f"{key} ({_short(was.get(key))} -> {_short(now.get(key))})" for key in changed[:4]
    )
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    return f"the manifest changed since it was made: {shown}{more}"


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted key paths: how a lock's inputs and two stacks are compared."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def _short(value: Any) -> str:
    text = "unset" if value is None else canonical_json(value)
    return text if len(text) <= 40 else text[:37] + "..."
