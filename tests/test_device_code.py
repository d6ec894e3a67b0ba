"""Libraries without machine code for the stack's GPUs are found in real ELF files (CPU only).

The files are written byte by byte (tests/support/fatbin_elf.py) in the layout cuobjdump reads;
tests/engine/test_device_code.py runs the same scan on nvcc's own output inside an image.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.manifest.device_code import device_code_knowledge, gpu_targets
from builder.manifest.resolve import resolve
from builder.verify import fatbin
from builder.verify.device_code import finding_rows, scan_command, scan_config
from tests.support import fatbin_elf as elf

REPO = Path(__file__).resolve().parent.parent
STACKS = REPO / "stacks"
SM120 = {"sm_120": [12, 0]}
FA2 = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_the_reader_names_each_entry_as_cuobjdump_does(tmp_path: Path) -> None:
    lib = elf.library(
        elf.container(
            elf.entry(elf.ELF, 90, elf.cubin(["k"]), elf.PLAIN | elf.ARCH_SPECIFIC),
            elf.entry(elf.ELF, 120, elf.cubin(["k"])),
            elf.entry(elf.PTX, 80, elf.ptx(["k"], 80), elf.ZSTD, uncompressed=4000),
        )
    )
    found = fatbin.containers(lib)
    assert [[(e.name, e.compressed) for e in c] for c in found] == [
        [("sm_90a", False), ("sm_120", False), ("compute_80", True)]
    ]
    assert found[0][2].text_size == 4000  # what the driver would compile, not the zstd frame
    assert fatbin.containers(b"\x7fELF" + bytes(200)) == []  # no section table: no fatbin


def test_kernels_are_counted_from_the_cubin_or_the_ptx_never_device_functions() -> None:
    kernels = ["_Z5scalePfi", "_Z4addnILi1EEvPf", "_Z4addnILi2EEvPf"]
    lib = elf.library(
        elf.container(
            elf.entry(elf.ELF, 80, elf.cubin(kernels, ("_Z5twicef",))),
            elf.entry(elf.PTX, 80, elf.ptx(kernels, 80)),
        )
    )
    cubin, text = fatbin.containers(lib)[0]
    assert (fatbin.cubin_kernels(lib, cubin), fatbin.ptx_kernels(lib, text)) == (3, 3)
    squeezed = elf.entry(elf.PTX, 80, b"\x28\xb5\x2f\xfd" + bytes(60), elf.ZSTD, 900)
    (compressed,) = fatbin.containers(elf.library(elf.container(squeezed)))[0]
    assert fatbin.ptx_kernels(lib, compressed) is None  # zstd: not read, so not guessed


def test_an_fa2_shaped_library_is_a_driver_compile_on_sm120_and_sm90(tmp_path: Path) -> None:
    data, ptx_bytes = elf.fa2_like(kernels_per_module=3, modules=2)
    path = _write(tmp_path / "fa2.so", data)
    code = fatbin.library_code(str(path), {**SM120, "sm_90": [9, 0], "sm_86": [8, 6]})
    assert code is not None
    assert (code["modules"], code["sass"], code["ptx"]) == (2, ["sm_80"], ["compute_80"])
    assert set(code["lacking"]) == {"sm_120", "sm_90"}  # sm_80 code runs on 8.6 only
    lack = code["lacking"]["sm_120"]
    assert (lack["jit_modules"], lack["kernels"], lack["ptx_bytes"]) == (2, 6, ptx_bytes)
    assert (lack["sass_modules"], lack["no_code_modules"], lack["ptx_archs"]) == (
        0,
        0,
        ["compute_80"],
    )


def test_machine_code_runs_on_later_minors_of_its_major_and_a_code_on_its_own_only(
    tmp_path: Path,
) -> None:
    sm120 = elf.container(elf.entry(elf.ELF, 120, elf.cubin(["a", "b"])))
    sm90a = elf.container(
        elf.entry(elf.ELF, 90, elf.cubin(["c"]), elf.PLAIN | elf.ARCH_SPECIFIC),
        elf.entry(elf.PTX, 90, elf.ptx(["c"], 90), elf.PLAIN | elf.ARCH_SPECIFIC),
    )
    path = _write(tmp_path / "lib.so", elf.library(sm120, sm90a))
    targets = {"sm_120": [12, 0], "sm_121": [12, 1], "sm_90": [9, 0]}
    lacking = fatbin.library_code(str(path), targets)["lacking"]  # type: ignore[index]
    # 12.0 and 12.1 run sm_120's module; sm_90a's has no code and compute_90a PTX is 9.0's only
    for gpu in ("sm_120", "sm_121"):
        assert (lacking[gpu]["sass_modules"], lacking[gpu]["no_code_modules"]) == (1, 1)
        assert lacking[gpu]["jit_modules"] == 0
    assert (lacking["sm_90"]["sass_modules"], lacking["sm_90"]["no_code_kernels"]) == (1, 2)


def test_a_module_without_kernels_is_nothing_to_load(tmp_path: Path) -> None:
    stub = elf.container(elf.entry(elf.ELF, 80, elf.cubin([])))  # nvcc's device runtime stub
    served = elf.container(elf.entry(elf.ELF, 120, elf.cubin(["k"])))
    path = _write(tmp_path / "lib.so", elf.library(stub, served))
    assert fatbin.library_code(str(path), SM120)["lacking"] == {}  # type: ignore[index]


def test_relocatable_device_code_is_not_what_the_driver_loads(tmp_path: Path) -> None:
    relocatable = elf.container(elf.entry(elf.PTX, 80, elf.ptx(["k"], 80)))
    lib = elf.library(
        elf.container(elf.entry(elf.ELF, 120, elf.cubin(["k"]))), relocatable=relocatable
    )
    assert [e.name for c in fatbin.containers(lib) for e in c] == ["sm_120"]
    both = fatbin.containers(lib, fatbin.ALL_SECTIONS)
    assert [e.name for c in both for e in c] == ["sm_120", "compute_80"]


def _image_tree(root: Path) -> Path:
    site = root / "site-packages"
    data, _ = elf.fa2_like()
    _write(site / FA2, data)
    sm90a = elf.entry(elf.ELF, 90, elf.cubin(["fa3"]), elf.PLAIN | elf.ARCH_SPECIFIC)
    _write(site / "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", elf.library(elf.container(sm90a)))
    good = elf.library(elf.container(elf.entry(elf.ELF, 120, elf.cubin(["k"]))))
    _write(site / "torch/lib/libtorch_cuda.so", good)
    (site / "torch/lib/libtorch_cuda.so.2").hardlink_to(site / "torch/lib/libtorch_cuda.so")
    (site / "torch/lib/libc10.so").symlink_to("libtorch_cuda.so")
    _write(site / "pkg/_native.cpython-311-x86_64-linux-gnu.so", b"\x7fELF" + bytes(100))
    _write(site / "pkg/broken.so", data[:200])  # cut short: its section table is gone
    _write(site / "pkg/readme.txt", data)  # not a library name
    return site


def test_a_scan_reads_every_library_once_and_lists_those_with_device_code(tmp_path: Path) -> None:
    site = _image_tree(tmp_path)
    result = fatbin.scan({"roots": [str(site)], "targets": SM120, "budget_s": 60})
    by_path = {lib["relative"]: lib for lib in result["libraries"]}
    assert sorted(by_path) == [
        "torch/lib/libtorch_cuda.so",
        FA2,
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
    ]
    assert by_path["torch/lib/libtorch_cuda.so"]["lacking"] == {}
    assert by_path[FA2]["lacking"]["sm_120"]["kernels"] == 6
    # five files: the symlink is not followed, the hard link read once, readme.txt not a library
    assert (result["files"], result["unscanned"]) == (5, 0)
    (error,) = result["errors"]  # the file cut short is named; the scan went on
    assert "pkg/broken.so: error:" in error


def test_a_scan_that_runs_out_of_time_counts_what_it_left(tmp_path: Path) -> None:
    site = _image_tree(tmp_path)
    result = fatbin.scan({"roots": [str(site)], "targets": SM120, "budget_s": 0.000001})
    assert result["files"] <= 1 and result["files"] + result["unscanned"] == 5
    rows = finding_rows(result)
    assert rows[-1].status == "not-scanned" and "scan.budget_s" in rows[-1].detail


def test_the_scan_runs_as_python_c_with_the_standard_library_alone(tmp_path: Path) -> None:
    """As it runs in an image: `python -c SOURCE CONFIG`, with no builder package to import."""
    site = _image_tree(tmp_path)
    stack = resolve("vllm-0.33-b12x", STACKS)
    argv = scan_command(stack, python=sys.executable)
    config = {**json.loads(argv[-1]), "roots": [str(site)]}
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}  # the repo is not on it
    out = subprocess.run(
        [*argv[:-1], json.dumps(config)], capture_output=True, text=True, check=True, env=env
    )
    assert [lib["relative"] for lib in json.loads(out.stdout)["libraries"]] == sorted(
        [FA2, "torch/lib/libtorch_cuda.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"]
    )
    assert config["targets"] == SM120 and config["roots"] and config["budget_s"] > 0


def test_fa2_on_sm120_is_a_driver_jit_finding_naming_the_cuda_driver_kind(tmp_path: Path) -> None:
    site = _image_tree(tmp_path)
    rows = finding_rows(fatbin.scan({"roots": [str(site)], "targets": SM120, "budget_s": 60}))
    by_name = {row.module: row for row in rows}
    fa2 = by_name[FA2]
    assert (fa2.kind, fa2.status, fa2.archs) == (
        "driver-jit",
        "driver-jit",
        ["sm_80", "compute_80"],
    )
    assert fa2.bytes == elf.fa2_like()[1]
    assert fa2.detail.startswith("6 kernels, no sm_120 code: driver JIT of compute_80 PTX at first")
    assert "cuda_driver" in fa2.detail and "default attention on sm120" in fa2.detail
    fa3 = by_name["vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"]
    assert (fa3.status, fa3.archs, fa3.bytes) == ("no-code", ["sm_90a"], 0)
    assert "torch/lib/libtorch_cuda.so" not in by_name  # it has sm_120 machine code


def test_a_scan_that_failed_is_one_row_saying_why() -> None:
    (row,) = finding_rows({"error": "the scan exited 127: python: not found"})
    assert (row.status, row.detail) == ("not-scanned", "the scan exited 127: python: not found")


@pytest.mark.parametrize(
    ("stack", "targets"),
    [
        ("vllm-0.33-b12x", SM120),
        ("vllm-0.33-spark", {"sm_121": [12, 1]}),
        ("vllm-0.33-sm90", {"sm_90": [9, 0]}),
    ],
)
def test_the_targets_are_the_manifest_gpus(stack: str, targets: dict[str, list[int]]) -> None:
    resolved = resolve(stack, STACKS)
    assert gpu_targets(resolved) == targets == scan_config(resolved)["targets"]


def test_the_knowledge_names_the_driver_kind_the_smoke_reports() -> None:
    knowledge = device_code_knowledge()
    assert knowledge.kind == "cuda_driver"  # served.py's compiles key for CUDA_CACHE_PATH
    assert FA2 in knowledge.known and knowledge.scan.roots == ["site-packages"]


def test_the_gpu_bundle_strip_reads_the_same_fatbins(tmp_path: Path) -> None:
    """bench/fatbin_strip.py uses builder/verify/fatbin.py: it keeps sm_120's code, zeroes the
    rest, and the file still reads."""
    data, _ = elf.fa2_like(modules=1)
    keep = elf.container(elf.entry(elf.ELF, 120, elf.cubin(["k"])))
    path = _write(tmp_path / "lib.so", elf.library(keep))
    mixed = _write(tmp_path / "mixed.so", data)
    script = REPO / "bench" / "fatbin_strip.py"
    run = [sys.executable, str(script), "--keep", "sm_120", str(path), str(mixed)]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "lib.so: kept 0.0 MB of device code, zeroed 0.0 MB" in out
    stripped = mixed.read_bytes()
    (cubin, text) = fatbin.containers(stripped)[0]
    assert stripped[cubin.payload] == bytes(cubin.size)  # sm_80 code zeroed
    assert text.compressed and stripped[text.payload].startswith(b"\x28\xb5\x2f\xfd")  # PTX kept
