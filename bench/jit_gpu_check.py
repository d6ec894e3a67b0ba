"""Prove on a real GPU that a FlashInfer module precompiled on the GPU-less builder is used as is.

Run on the GPU machine with the module tree exported from a built image (`aot/norm/norm.so`, see
bench/RESULTS.md for the exact commands). Three runs, each in a fresh process and workspace:

  cached   the image's layout (the .so in FlashInfer's AOT directory), FLASHINFER_DISABLE_JIT=1,
           so any compile attempt fails; flashinfer.norm.rmsnorm on random inputs must match a
           float32 torch reference.
  control  the same without the .so: must fail with MissingJITCacheError (the check has teeth).
  cold     without the .so and with JIT allowed: FlashInfer compiles the module here; the first
           call's time and peak memory are the cost the cache removes.

FLASHINFER_USE_CUDA_NORM=1 makes rmsnorm use the nvcc-built `norm` module: in 0.6.11.post2 it
otherwise runs a CuTe-DSL kernel and would never touch the cache.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child() -> int:
    import flashinfer
    import torch
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.norm import gen_norm_module

    spec = gen_norm_module()
    torch.manual_seed(0)
    x = torch.randn(128, 8192, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(8192, dtype=torch.bfloat16, device="cuda")
    started = time.monotonic()
    try:
        y = flashinfer.norm.rmsnorm(x, w, eps=1e-6)
        torch.cuda.synchronize()
    except Exception as exc:  # the control run expects MissingJITCacheError
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}))
        return 1
    first_call = time.monotonic() - started
    xf = x.float()
    reference = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    error = (y.float() - reference).abs().max().item()
    print(
        json.dumps(
            {
                "ok": error < 0.05,
                "max_abs_error": round(error, 5),
                "first_call_s": round(first_call, 3),
                "loaded_from_aot": spec.is_aot,
                "device": torch.cuda.get_device_name(),
                "compiled_here": (jit_env.FLASHINFER_JIT_DIR / "norm" / "norm.so").exists(),
                "flashinfer": flashinfer.__version__,
                "torch": torch.__version__,
            }
        )
    )
    return 0


def run(mode: str, aot_file: Path, module_so: Path | None) -> dict[str, object]:
    if module_so is not None:
        aot_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(module_so, aot_file)
    else:
        aot_file.unlink(missing_ok=True)
    env = {
        **os.environ,
        "SM120_GPU_CHECK_CHILD": "1",
        "FLASHINFER_USE_CUDA_NORM": "1",
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
        "MAX_JOBS": "8",
        "FLASHINFER_WORKSPACE_BASE": tempfile.mkdtemp(prefix=f"fi-{mode}-"),
    }
    if mode != "cold":
        env["FLASHINFER_DISABLE_JIT"] = "1"
    started = time.monotonic()
    child_run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [ln for ln in child_run.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False, "error": child_run.stderr[-500:]}
    result.update(
        mode=mode,
        process_s=round(time.monotonic() - started, 2),
        peak_rss_mb_so_far=round(usage.ru_maxrss / 1024),
    )
    return result


def main() -> int:
    if os.environ.get("SM120_GPU_CHECK_CHILD") == "1":
        return child()
    module_so = Path(sys.argv[1]).resolve()
    import importlib.util

    spec = importlib.util.find_spec("flashinfer")
    assert spec is not None and spec.origin is not None, "flashinfer is not installed"
    aot_file = Path(spec.origin).parent / "data" / "aot" / "norm" / "norm.so"
    results = [
        run("cached", aot_file, module_so),
        run("control", aot_file, None),
        run("cold", aot_file, None),
    ]
    for result in results:
        print(json.dumps(result, sort_keys=True))
    cached, control, cold = results
    passed = (
        bool(cached["ok"])
        and cached["loaded_from_aot"]
        and not cached["compiled_here"]
        and not control["ok"]
        and "MissingJITCacheError" in str(control.get("error"))
    )
    print("RESULT", "PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
