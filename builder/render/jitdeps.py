"""What the FlashInfer JIT stage is built from: the subset of a stack's packages its compile reads.

The compiled modules depend on the CUDA toolkit, torch, flashinfer-python and what its JIT
imports (knowledge/jit_dependencies.yaml), the patches to those packages, the arch list, the
module list and the compile flags, and on nothing else. The jit-deps stage installs exactly that
subset FROM toolchain, so BuildKit's key for it, and for every compile after it, stays the same
when vLLM or any unrelated pin moves; and the compile's cache mount is named by the same inputs,
not by the stack, so every stack with the same FlashInfer, torch, CUDA, arch and flags shares it.
"""

from __future__ import annotations

import hashlib

from builder.knowledge.jit_dependencies import jit_dependency_names
from builder.lock.lockfile import Lock, normalize
from builder.manifest.model import PackagePin, Patch
from builder.manifest.resolve import ResolvedStack, canonical_json
from builder.render.bases import base_identity
from builder.render.requirements import lock_requirements


def jit_package_names(stack: ResolvedStack, lock: Lock | None) -> list[str]:
    """The packages the jit-deps stage installs: with a lock, its heavy part (torch and all it
    needs) and the locked packages of FlashInfer's closure; without one, the manifest's heavy
    pins and its pins of that closure (pip resolves the rest, as the packages stage does)."""
    python = stack.manifest.python
    # torch is always the JIT's: a lock with no heavy part holds it among its packages.
    wanted = jit_dependency_names() | {normalize(n) for n in python.heavy}
    if lock is not None:
        locked = lock.python
        names = {*locked.heavy, *(n for n in locked.packages if normalize(n) in wanted)}
    else:
        names = {n for n in {**python.packages, **python.overrides} if normalize(n) in wanted}
    return sorted(names)


def jit_requirements(stack: ResolvedStack, lock: Lock | None) -> str:
    """requirements/jit.txt: with a lock, the closure's packages outside the heavy part, hash
    pinned (the heavy part is lock-heavy.txt, installed first in a layer of its own);
    without one, the closure's manifest pins, the heavy ones included."""
    names = set(jit_package_names(stack, lock))
    if lock is not None:
        python = lock.python
        subset = {n: pin for n, pin in python.packages.items() if n in names}
        part = lock.model_copy(update={"python": python.model_copy(update={"packages": subset})})
        return lock_requirements(part, "packages").replace("(packages)", "(the JIT's part)", 1)
    py = stack.manifest.python
    pins: dict[str, PackagePin] = {**py.packages, **py.overrides}
    lines = [
        "# The JIT's part of the stack's pins; pip resolves what they need.",
        f"--index-url {py.index_url}",
        *(f"--extra-index-url {url}" for url in py.extra_index_urls),
    ]
    for name in sorted(names):
        pin = pins[name]
        extras = f"[{','.join(pin.extras)}]" if pin.extras else ""
        lines.append(f"{name}{extras}=={pin.version}")
    return "\n".join(lines) + "\n"


def jit_patches(stack: ResolvedStack, lock: Lock | None) -> list[Patch]:
    """The stack's patches to packages the JIT stage installs (a FlashInfer fix, say): applied
    there too, so the modules are compiled from the sources the image ships."""
    names = {normalize(n) for n in jit_package_names(stack, lock)}
    return [p for p in stack.manifest.patches if normalize(p.package) in names]


def jit_inputs_digest(
    stack: ResolvedStack,
    lock: Lock | None,
    build_base: str,
    apt: list[str],
    jit_env: dict[str, str],
) -> str:
    """What a compiled module depends on besides its own name: the toolchain (base, CUDA, apt,
    toolchain env), the JIT's packages (with a lock, their pins and hashes), the patches to
    them, the local wheels and the compile flags and arch (the JIT's environment). No stack
    name, no other pin: ninja judges freshness by file times and would take objects built
    against another torch or nvcc for current ones, so exactly these inputs name the mount.

    The base counts by what it is (bases.base_identity: its digest or image ID), never by its
    name: the same image under another name shares the mount, and another image under the
    same name (a base made again) gets a mount of its own."""
    m = stack.manifest
    inputs = {
        "base": base_identity(build_base),
        "cuda": m.cuda,
        "apt": apt,
        "toolchain_env": m.build.toolchain_env,
        "python": m.python.version,
        "requirements": jit_requirements(stack, lock),
        "wheels": sorted(m.python.wheels),
        "patches": [p.sha256 for p in jit_patches(stack, lock)],
        "jit_env": jit_env,
    }
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()[:12]
