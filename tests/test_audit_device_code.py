"""The audit's device-code reader (cuobjdump from the nvidia-cuda-cuobjdump wheel) on libraries
nvcc builds here: one with machine code for two archs, one with PTX only; no wheel needed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from builder import REPO_ROOT
from builder.errors import StackError, ToolMissing
from builder.upstream.cuobjdump import find_cuobjdump, read_device_code, runs_on
from builder.upstream.device_audit import device_findings

SOURCE = """
__global__ void marlin_gemm_kernel(float *x) { x[threadIdx.x] *= 2.0f; }
__global__ void scale_kernel(float *x, float by) { x[threadIdx.x] *= by; }
"""
TWO_ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_120,code=sm_120"]
MAGIC = bytes.fromhex("50ed55ba")  # a fatbin container's first four bytes
PTX_ONLY = ["-gencode", "arch=compute_80,code=compute_80"]


@pytest.fixture(scope="module")
def tool() -> Path:
    try:
        return find_cuobjdump(REPO_ROOT / "build" / "tools")
    except ToolMissing as exc:
        pytest.skip(f"NOT RUN: no cuobjdump ({exc})")


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("NOT RUN: no nvcc on this machine to build the test libraries")
    folder = tmp_path_factory.mktemp("fatbin")
    (folder / "k.cu").write_text(SOURCE)
    out = {}
    for name, flags in (("two_archs", TWO_ARCHS), ("ptx_only", PTX_ONLY)):
        out[name] = folder / f"lib{name}.so"
        command = [nvcc, "-shared", "-Xcompiler", "-fPIC", *flags, "-o", str(out[name])]
        subprocess.run([*command, str(folder / "k.cu")], check=True, capture_output=True)
    return out


def test_machine_code_of_two_archs_and_ptx_only_are_told_apart(
    tool: Path, libraries: dict[str, Path]
) -> None:
    two = read_device_code(tool, libraries["two_archs"])
    ptx = read_device_code(tool, libraries["ptx_only"])
    assert two is not None and ptx is not None
    assert {arch: sorted(names) for arch, names in two.sass.items()} == {
        arch: ["_Z12scale_kernelPff", "_Z18marlin_gemm_kernelPf"] for arch in ("sm_80", "sm_120")
    }
    assert two.ptx == {}
    assert (ptx.sass, ptx.ptx) == ({}, {"compute_80": 1})
    assert (two.functions("sm_120", "Marlin"), two.functions("sm_80")) == (1, 2)


def test_losing_the_gpus_machine_code_is_a_finding_per_family(
    tool: Path, libraries: dict[str, Path]
) -> None:
    old = {"vllm/_moe_C.so": read_device_code(tool, libraries["two_archs"])}
    new = {"vllm/_moe_C.so": read_device_code(tool, libraries["ptx_only"])}
    rows, found = device_findings(
        "new.whl",
        {k: v for k, v in new.items() if v},
        {k: v for k, v in old.items() if v},
        {"sm_120": [12, 0]},
    )
    assert [(r.on_gpu, r.before) for r in rows] == [("PTX compute_80: driver JIT", "machine code")]
    assert [(f.family, f.lost, f.text) for f in found] == [
        (
            "Marlin",
            1,
            "lost sm_120 machine code: 1 functions of Marlin MoE; "
            "PTX compute_80 remains: driver JIT at first use",
        )
    ]


def test_a_library_whose_fatbin_cannot_be_read_is_bad_input_naming_it(
    tool: Path, libraries: dict[str, Path], tmp_path: Path
) -> None:
    garbage = tmp_path / "libgarbage.so"
    garbage.write_bytes(b"not an ELF at all" * 10)
    with pytest.raises(StackError, match="libgarbage.so: not an ELF file"):
        read_device_code(tool, garbage)
    broken = tmp_path / "libbroken.so"  # every fatbin header's magic zeroed
    broken.write_bytes(libraries["two_archs"].read_bytes().replace(MAGIC, bytes(4)))
    with pytest.raises(StackError, match="libbroken.so: .*cannot read"):
        read_device_code(tool, broken)


def test_which_code_runs_on_which_gpu() -> None:
    assert runs_on("sm_120f", 12, 1) and not runs_on("sm_120a", 12, 1)
    assert not runs_on("sm_80", 12, 0) and runs_on("compute_80", 12, 0)
    assert runs_on("sm_120", 12, 1) and not runs_on("sm_121", 12, 0)
