"""Can a Triton kernel be compiled for a named GPU on a machine without one, and does the GPU
then take it from TRITON_CACHE_DIR instead of compiling? (bench/RESULTS.md §5, Triton caches)

    python bench/triton_aot_check.py compile DIR 90 120   # here: no GPU, no driver
    python bench/triton_aot_check.py run DIR              # on the GPU, DIR copied there

`compile` calls triton.compile with an explicit GPUTarget and the specialisation the runtime
will use for the `run` call (16-byte-aligned pointers and a length divisible by 16, Triton's
"D" attribute), writing Triton's own cache layout. `run` launches the same kernel normally
with TRITON_CACHE_DIR=DIR: if no new cache entry appears, the runtime took the precompiled
binary; a second kernel variant nobody precompiled (another BLOCK) shows what a miss looks
like. Needs the same Triton version (the cache key holds it, the target and ptxas's version).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


N = 4096
BLOCK = 1024


def entries(cache: Path) -> dict[str, float]:
    """Kernel entries (not Triton's launcher/driver helpers) and when their metadata was written."""
    return {p.parent.name: p.stat().st_mtime for p in cache.glob("*/add_kernel.json")}


def compile_for(cache: Path, capabilities: list[int]) -> list[dict[str, object]]:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    divisible = [["tt.divisibility", 16]]
    source = ASTSource(
        fn=add_kernel,
        signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
        | {"BLOCK": "constexpr"},
        constexprs={"BLOCK": BLOCK},
        attrs={(0,): divisible, (1,): divisible, (2,): divisible, (3,): divisible},
    )
    results = []
    for capability in capabilities:
        began = time.monotonic()
        kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32))
        results.append(
            {
                "target": f"sm_{capability}",
                "seconds": round(time.monotonic() - began, 2),
                "cubin_bytes": len(kernel.asm["cubin"]),
                "cache_entries": len(entries(cache)),
            }
        )
    return results


def run(cache: Path) -> dict[str, object]:
    import torch

    x = torch.rand(N, device="cuda")
    y = torch.rand(N, device="cuda")
    out = torch.empty_like(x)
    add_kernel[(1,)](x, y, out, 16, BLOCK=16)  # builds Triton's launcher helpers first
    torch.cuda.synchronize()
    before = entries(cache)
    began = time.monotonic()
    add_kernel[(N // BLOCK,)](x, y, out, N, BLOCK=BLOCK)
    torch.cuda.synchronize()
    precompiled_s = time.monotonic() - began
    after_precompiled = entries(cache)
    rewritten = [k for k, t in before.items() if after_precompiled.get(k) != t]
    began = time.monotonic()
    add_kernel[(N // 512,)](x, y, out, N, BLOCK=512)
    torch.cuda.synchronize()
    other_s = time.monotonic() - began
    after_other = entries(cache)
    return {
        "device": torch.cuda.get_device_name(),
        "triton": triton.__version__,
        "correct": bool(torch.allclose(out, x + y)),
        "precompiled_variant": {
            "first_call_s": round(precompiled_s, 3),
            "new_cache_entries": len(set(after_precompiled) - set(before)),
            "precompiled_entries_rewritten": len(rewritten),
        },
        "other_variant": {
            "first_call_s": round(other_s, 3),
            "new_cache_entries": len(set(after_other) - set(after_precompiled)),
        },
    }


def main(argv: list[str]) -> int:
    mode, cache = argv[0], Path(argv[1]).resolve()
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    if mode == "compile":
        result: object = compile_for(cache, [int(c) for c in argv[2:]] or [90])
    else:
        result = run(cache)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
