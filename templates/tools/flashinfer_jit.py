#!/usr/bin/env python3
"""Precompile and verify FlashInfer JIT modules inside an image (copied in by sm120-stacks).

precompile MODULE...  builds each module alone (JitSpec.build: per-module ninja log, so the
                      first runtime use finds nothing to do), then promotes its .so into
                      FlashInfer's AOT directory, which build_and_load() checks before any
                      ninja run and which FLASHINFER_DISABLE_JIT=1 accepts.
verify MODULE...      reports, per module, hit / stale / miss as JSON lines without ever
                      compiling: AOT file present, the build.ninja this environment would write
                      equal to the cached one, `ninja -n` finding no work, and the device-code
                      archs in the .so (cuobjdump).

The module table (jit-modules.json beside this file) comes from knowledge/flashinfer_modules.yaml.
Exit status: 0 ok, 1 a build or check failed, 2 an unknown module name.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TABLE = json.loads((HERE / "jit-modules.json").read_text())
RECORD = "sm120-stacks-jit.json"


def import_flashinfer() -> bool:
    """Import flashinfer on a machine without a GPU; True when the workaround was needed.

    flashinfer 0.6.11 reads torch.cuda.get_device_properties(0) at import time
    (gdn_kernels/gdn_decode_bf16_state.py, NUM_SMS), which raises without a GPU. Only then,
    and only for the import, that one function is replaced; compiling never uses its values.
    """
    if "FLASHINFER_CUDA_ARCH_LIST" not in os.environ:
        sys.exit("flashinfer_jit: FLASHINFER_CUDA_ARCH_LIST is not set")
    import torch

    no_gpu = torch.cuda.device_count() == 0
    original = torch.cuda.get_device_properties
    if no_gpu:
        torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(  # type: ignore[assignment]
            name="no-gpu", major=0, minor=0, multi_processor_count=1, total_memory=0
        )
    try:
        importlib.import_module("flashinfer")
    finally:
        torch.cuda.get_device_properties = original
    return no_gpu


def spec_for(name: str) -> Any:  # a flashinfer.jit.core.JitSpec
    entry = TABLE[name]
    module_name, function = entry["generator"].split(":")
    args = [generator_arg(arg) for arg in entry.get("args", [])]
    spec = getattr(importlib.import_module(module_name), function)(*args)
    if spec.name != name:
        raise SystemExit(f"flashinfer_jit: {entry['generator']} makes {spec.name!r}, not {name!r}")
    return spec


def generator_arg(value: Any) -> Any:
    """A generator argument from the table: "torch.bfloat16" is that dtype, the rest as is."""
    if isinstance(value, str) and value.startswith("torch."):
        import torch

        dtype = getattr(torch, value.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise SystemExit(f"flashinfer_jit: {value!r} is not a torch dtype")
        return dtype
    return value


def check_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in TABLE]
    if unknown:
        print(
            f"flashinfer_jit: unknown module(s) {' '.join(unknown)}; "
            f"known: {' '.join(sorted(TABLE))}",
            file=sys.stderr,
        )
        sys.exit(2)


def precompile(names: list[str]) -> int:
    """Each module in a child process of its own, so its peak memory is measured alone."""
    check_names(names)
    records = []
    for index, name in enumerate(names, 1):
        print(
            f"flashinfer_jit: [{index}/{len(names)}] compiling {name} "
            f"for {os.environ['FLASHINFER_CUDA_ARCH_LIST']} "
            f"with MAX_JOBS={os.environ.get('MAX_JOBS')}",
            flush=True,
        )
        started = time.monotonic()
        child = subprocess.Popen([sys.executable, __file__, "_build_one", name])
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.monotonic() - started
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"flashinfer_jit: {name} failed after {seconds:.0f}s", file=sys.stderr)
            return 1
        records.append(
            {
                "module": name,
                "seconds": round(seconds, 1),
                "peak_rss_mb": round(usage.ru_maxrss / 1024),
            }
        )
        print(
            f"flashinfer_jit: {name} done in {seconds:.0f}s, "
            f"peak {usage.ru_maxrss / 1024:.0f} MB per process",
            flush=True,
        )
    workspace = Path(os.environ["FLASHINFER_WORKSPACE_BASE"])
    (workspace / RECORD).write_text(json.dumps(records, indent=2) + "\n")
    return 0


def build_one(name: str) -> int:
    import_flashinfer()
    spec = spec_for(name)
    spec.build(verbose=True)  # ninja's [n/N] lines show progress; flags stay the same
    if not spec.jit_library_path.is_file():
        print(f"flashinfer_jit: {spec.jit_library_path} missing after the build", file=sys.stderr)
        return 1
    spec.aot_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.jit_library_path, spec.aot_path)
    return 0


def verify(names: list[str]) -> int:
    check_names(names)
    import_flashinfer()
    from flashinfer.jit.cpp_ext import generate_ninja_build_for_op

    failed = False
    for name in names:
        spec = spec_for(name)
        result = {"module": name, "aot": spec.is_aot, "cached": spec.jit_library_path.is_file()}
        library = spec.aot_path if spec.is_aot else spec.jit_library_path
        if not library.is_file():
            result.update(status="miss", detail="no precompiled .so: it would compile on first use")
        else:
            result["bytes"] = library.stat().st_size
            result["archs"] = device_archs(library)
            fresh, detail = ninja_fresh(spec, generate_ninja_build_for_op)
            result["jit_fresh"] = fresh
            result["status"] = "hit" if spec.is_aot or fresh else "stale"
            if spec.is_aot:
                # build_and_load() loads the AOT copy before it would ever run ninja. The JIT
                # tree of a generator that writes CUTLASS sources is incomplete in the image
                # (they stay in the build's cache mount), which does not matter then.
                result["detail"] = "served from FlashInfer's AOT copy"
            elif detail:
                result["detail"] = detail
        failed = failed or result["status"] != "hit"
        print(json.dumps(result, sort_keys=True), flush=True)
    return 1 if failed else 0


def ninja_fresh(spec: Any, generate: Callable[..., str]) -> tuple[bool, str]:
    """Would the runtime's ninja run find nothing to do? Decided by a dry run; compiles nothing."""
    if not spec.ninja_path.is_file():
        return False, "no build.ninja in the cache"
    expected = generate(
        name=spec.name,
        sources=spec.sources,
        extra_cflags=spec.extra_cflags,
        extra_cuda_cflags=spec.extra_cuda_cflags,
        extra_ldflags=spec.extra_ldflags,
        extra_include_dirs=spec.extra_include_dirs,
        needs_device_linking=spec.needs_device_linking,
    )
    if expected != spec.ninja_path.read_text():
        return False, "this environment writes a different build.ninja (compiler flags differ)"
    dry = subprocess.run(
        ["ninja", "-n", "-C", str(spec.build_dir), "-f", str(spec.ninja_path)],
        capture_output=True,
        text=True,
    )
    if "no work to do" not in dry.stdout:
        return False, "ninja would rebuild: " + " ".join(dry.stdout.split())[:300]
    return True, ""


def device_archs(library: Path) -> list[str]:
    """The archs of the device code in a .so, as nvcc spelled them (sm_120f, sm_90a...)."""
    tool = shutil.which("cuobjdump") or str(
        Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "cuobjdump"
    )
    if not Path(tool).exists():
        return ["unknown (no cuobjdump)"]
    dump = subprocess.run([tool, "-elf", str(library)], capture_output=True, text=True)
    return sorted(set(re.findall(r"^arch = (\S+)", dump.stdout, flags=re.MULTILINE)))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("precompile", "verify", "_build_one"):
        print(__doc__, file=sys.stderr)
        return 2
    command, names = argv[0], argv[1:]
    if command == "_build_one":
        return build_one(names[0])
    return verify(names) if command == "verify" else precompile(names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
