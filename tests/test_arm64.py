"""The arm64 stacks offline: ci-mini-arm64 (built under emulation by `make arm64-emulated`, not by
`make test`: binfmt_misc is not there on every CI machine) and the Spark stack's base substitution.

What they render and how they would be built, with no engine: the platform reaches the build
command, the bases are arm64 ones, no x86_64 wheel is left, and nothing an amd64 build compiled
can be shared with an arm64 one.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from builder import REPO_ROOT
from builder.image.build import BuildOptions, build_argv
from builder.image.buildclient import BuildClient
from builder.lock.inputs import flatten, lock_inputs
from builder.lock.uv_compile import UV_PLATFORMS
from builder.manifest.resolve import resolve
from builder.manifest.substitute import Substitutions
from builder.render.context import render
from tests.conftest import STACKS

ARM64_CUDA_BASE = "local/cuda:13.0.2-devel-bookworm-arm64"
#: What ci-mini-arm64 may change from ci-mini: what arm64 forces, and the emulated server's start.
ARM64_CHANGES = {
    "description",
    "platform",
    "bases.build.image",
    "bases.runtime.image",
    "python.wheels",
    "python.packages.torch.version",
    "smoke.health_timeout_s",
}


def _argv(name: str, tmp_path: Path, substitutions: Substitutions | None = None) -> list[str]:
    stack = resolve(name, STACKS, substitutions)
    client = BuildClient("classic+buildkit", ("docker", "build"), {"DOCKER_BUILDKIT": "1"})
    return build_argv(stack, render(stack), tmp_path, client, BuildOptions(), tmp_path / "iid")


def test_ci_mini_arm64_is_ci_mini_but_for_what_arm64_forces() -> None:
    mini = flatten(resolve("ci-mini", STACKS).manifest.model_dump(mode="json"))
    arm = flatten(resolve("ci-mini-arm64", STACKS).manifest.model_dump(mode="json"))
    changed = {key for key in mini.keys() | arm.keys() if mini.get(key) != arm.get(key)}
    assert changed == ARM64_CHANGES
    assert arm["platform"] == "linux/arm64"
    assert arm["bases.build.image"] == arm["bases.runtime.image"] == ARM64_CUDA_BASE


def test_ci_mini_arm64_builds_for_arm64_from_its_arm64_base(tmp_path: Path) -> None:
    argv = _argv("ci-mini-arm64", tmp_path)
    assert argv[argv.index("--platform") + 1] == "linux/arm64"
    dockerfile = render(resolve("ci-mini-arm64", STACKS)).dockerfile
    assert re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)[0] == ARM64_CUDA_BASE
    assert _argv("ci-mini", tmp_path)[argv.index("--platform") + 1] == "linux/amd64"


def test_ci_mini_arm64_names_no_wheel_of_another_architecture() -> None:
    stack = resolve("ci-mini-arm64", STACKS)
    wheels = [Path(w).name for w in stack.manifest.python.wheels]
    assert not [w for w in wheels if re.search(r"x86_64|amd64|win|macosx", w)]
    # No local version label: torch's +cpu builds exist for x86_64 only on the indexes it uses.
    assert "+" not in stack.manifest.python.packages["torch"].version


def test_an_emulated_compile_never_shares_a_workspace_with_the_amd64_one() -> None:
    """The FlashInfer workspace mount holds host objects (x86-64 or AArch64 .o files)."""

    def mount_ids(name: str) -> set[str]:
        dockerfile = render(resolve(name, STACKS)).dockerfile
        return set(re.findall(r"type=cache,id=(sm120-stacks-flashinfer-\S+?),", dockerfile))

    arm, amd = mount_ids("ci-mini-arm64"), mount_ids("ci-mini")
    assert arm and amd and not arm & amd


def test_arm64_stacks_lock_for_aarch64() -> None:
    assert UV_PLATFORMS["linux/arm64"].startswith("aarch64-")
    for name in ("ci-mini-arm64", "vllm-0.33-spark"):
        assert lock_inputs(resolve(name, STACKS))["platform"] == "linux/arm64"


def test_the_spark_stack_substitutes_to_the_local_arm64_base(tmp_path: Path) -> None:
    """How vllm-0.33-spark would build here under emulation: an exact rule to the arm64 tag."""
    rule = Substitutions.parse([f"nvidia/cuda:13.0.2-devel-ubuntu24.04={ARM64_CUDA_BASE}"])
    argv = _argv("vllm-0.33-spark", tmp_path, rule)
    assert argv[argv.index("--platform") + 1] == "linux/arm64"
    dockerfile = render(resolve("vllm-0.33-spark", STACKS, rule)).dockerfile
    assert set(re.findall(r"^FROM (\S+) AS", dockerfile, re.MULTILINE)) <= {
        ARM64_CUDA_BASE,
        "toolchain",
        "jit-deps",  # what the JIT compile reads, FROM toolchain (builder/render/jitdeps.py)
        "packages",
        "patched",
        "jit-cache",
    }
    assert ARM64_CUDA_BASE in dockerfile


def test_make_base_local_refuses_an_architecture_no_stack_has() -> None:
    script = REPO_ROOT / "scripts" / "make-base-local.sh"
    for args in (["--arch", "riscv64"], ["--arch=i386"], ["--bogus"]):
        result = subprocess.run(
            [str(script), *args], capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith("make-base-local: "), result.stderr
