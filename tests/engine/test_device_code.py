"""`test`'s device-code finding on ci-mini's real image: nvcc's own output, read in the image.

ci-mini's runtime base has nvcc: a library built the way vLLM 0.33 ships FA2 (sm_80 machine
code and compute_80 PTX only) is compiled inside a container of the image, at FA2's path, and
committed as an image of its own. The scan must name it a driver compile on ci-mini's sm120,
with its kernels and PTX, and find nothing in ci-mini's own image (its FlashInfer module has
sm_120 code).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.manifest.resolve import resolve
from builder.render.context import VENV
from builder.verify.device_code import device_code_finding
from tests.engine.conftest import unique

pytestmark = [
    pytest.mark.engine,
    pytest.mark.needs_ci_mini("scans ci-mini's real FlashInfer and torch device code"),
]

FA2 = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
SOURCE = r"""
__device__ __noinline__ float twice(float x) { return 2.0f * x; }
__global__ void scale(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] = twice(x[i]); }
template <int N> __global__ void addn(float* x) { x[threadIdx.x] += N; }
template __global__ void addn<1>(float*);
template __global__ void addn<2>(float*);
"""


@pytest.fixture
def fa2_image(ci_mini: dict[str, str], api: Any) -> Iterator[str]:
    """ci-mini's image with an sm_80 + compute_80 library compiled by nvcc at FA2's path."""
    site = f"{VENV}/lib/python3.11/site-packages"
    script = (
        f"mkdir -p {site}/vllm/vllm_flash_attn && cat > /tmp/k.cu <<'EOF'\n{SOURCE}\nEOF\n"
        "/usr/local/cuda/bin/nvcc -shared -Xcompiler -fPIC "
        f"-gencode arch=compute_80,code=[sm_80,compute_80] -o {site}/{FA2} /tmp/k.cu"
    )
    tag = unique("device-code-fa2")
    container = api.containers.run(
        ci_mini["ref"], ["sh", "-c", script], detach=True, network_mode="none"
    )
    try:
        status = container.wait(timeout=300)
        assert status["StatusCode"] == 0, container.logs()[-2000:].decode(errors="replace")
        container.commit(repository="sm120-stacks", tag=tag)
    finally:
        container.remove(force=True)
    yield f"sm120-stacks:{tag}"
    with contextlib.suppress(Exception):
        api.images.remove(f"sm120-stacks:{tag}", noprune=False)


def test_an_fa2_shaped_library_is_named_a_driver_compile_on_sm120(
    fa2_image: str, engine: Any, workspace: Path
) -> None:
    stack = resolve("ci-mini", workspace / "stacks")
    scan, rows = device_code_finding(engine, stack, fa2_image)
    assert "error" not in scan, scan
    assert scan["targets"] == {"sm_120": [12, 0]} and scan["unscanned"] == 0
    assert scan["files"] > 50 and scan["seconds"] < 60  # all of site-packages, quickly
    (row,) = rows
    assert (row.module, row.status, row.archs) == (FA2, "driver-jit", ["sm_80", "compute_80"])
    assert row.detail.startswith("3 kernels, no sm_120 code: driver JIT of compute_80 PTX")
    assert "cuda_driver" in row.detail and "default attention on sm120" in row.detail
    (library,) = [lib for lib in scan["libraries"] if lib["relative"] == FA2]
    lack = library["lacking"]["sm_120"]
    assert lack["ptx_bytes"] == row.bytes and row.bytes > 1000  # the uncompressed PTX
    assert (lack["kernels"], lack["jit_modules"]) == (3, 1)


def test_ci_minis_own_image_has_no_finding(
    ci_mini: dict[str, str], engine: Any, workspace: Path
) -> None:
    scan, rows = device_code_finding(
        engine, resolve("ci-mini", workspace / "stacks"), ci_mini["ref"]
    )
    assert rows == [], rows
    norm = [lib for lib in scan["libraries"] if lib["relative"].endswith("norm/norm.so")]
    assert [lib["sass"] for lib in norm] == [["sm_120"]]  # read, and its sm_120 code found
