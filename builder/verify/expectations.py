"""What a built image must look like, derived from its resolved stack (never written per stack).

validate.py hands this to the testinfra checks in image_checks.py as one JSON document, so the
checks themselves stay generic and every stack gets the same scrutiny.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from packaging.utils import canonicalize_name

from builder.lock.lockfile import Lock
from builder.manifest.resolve import ResolvedStack
from builder.manifest.serve import serve_argv
from builder.render.context import JIT_WORKSPACE, VENV, template_context


@dataclass(frozen=True)
class PatchExpectation:
    file: str
    package: str
    #: Lines the patch adds, by target file (relative to site-packages): the content check.
    added: dict[str, list[str]]


@dataclass(frozen=True)
class Expectations:
    stack: str
    content_hash: str
    python: str
    packages: dict[str, str]
    #: The lock's whole set (name -> version) when the stack has a lock: the image holds it exactly.
    locked: dict[str, str] | None
    env: dict[str, str]
    cuda_release: str
    nvcc_wheel: str | None
    patches: list[PatchExpectation]
    jit_modules: list[str]
    #: module -> the archs its device code must include.
    module_archs: dict[str, list[str]]
    cmd: list[str]
    port: int
    jit_workspace: str
    #: The stack's platform as Docker spells it (os/arch): what the image config must say.
    platform: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def expectations(stack: ResolvedStack, content_hash: str, lock: Lock | None) -> Expectations:
    m = stack.manifest
    pins = {**m.python.packages, **m.python.overrides}
    ctx = template_context(stack)
    env = {**ctx.jit_env, **ctx.env, "MAX_JOBS": str(ctx.max_jobs_default)}
    cuda_version = m.cuda.split(".")
    nvcc_pin = pins.get("nvidia-cuda-nvcc")
    return Expectations(
        stack=stack.name,
        content_hash=content_hash,
        python=f"{VENV}/bin/python",
        packages={str(canonicalize_name(n)): pin.version for n, pin in pins.items()},
        locked=lock.python.versions() if lock is not None else None,
        env=env,
        cuda_release=f"{cuda_version[0]}.{cuda_version[1]}",
        nvcc_wheel=nvcc_pin.version if nvcc_pin else None,
        patches=[
            PatchExpectation(
                p.file, p.package, added_lines(stack.local_file(p.file).read_text(), p.strip)
            )
            for p in m.patches
        ],
        jit_modules=list(stack.jit_modules),
        module_archs=stack.module_archs(),
        cmd=serve_argv(stack),
        port=m.serve.port,
        jit_workspace=JIT_WORKSPACE,
        platform=m.platform,
    )


def added_lines(patch_text: str, strip: int) -> dict[str, list[str]]:
    """Per target file, the non-blank lines a unified diff adds."""
    added: dict[str, list[str]] = {}
    target = ""
    for line in patch_text.splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0]
            target = "/".join(path.split("/")[strip:])
            added.setdefault(target, [])
        elif line.startswith("+") and target and line[1:].strip():
            added[target].append(line[1:])
    return added
