"""The fp8-KV route's proof on the GPU machine (bench/RESULTS.md §5): the FlashInfer modules
`sm120-stacks` derives for a stack's serve settings are the ones vLLM loads.

The control run (vllm-0.22-sm90 served with `--kv-cache-dtype fp8_e4m3`) compiled one module at
serve that the stack did not precompile. The stack vllm-0.22-sm90-fp8kv sets that KV cache
dtype, and the builder derives its attention modules from it (knowledge/attention_routes.yaml).
Here, after `h200_serve.py unpack`:

    python3 bench/h200_derived.py precompile   # the derived modules the bundle lacks, built by
                                               # the image's own JIT tool with the image's env
    python3 bench/h200_serve.py serve NAME     # the stack's command: 0 FlashInfer compiles?
    python3 bench/h200_derived.py verify       # every module of the stack: hit?

H200_ROOT (default /tmp/sm90), H200_SPEC (a serve-spec.json) and H200_TOOLS (a rendered tools/
folder) point it at another bundle and another stack's derivation.

The image builds its modules on the CPU builder (make flagship-local); here the same tool, the
same environment and the same module table (the stack's rendered tools/jit-modules.json) build
them on this machine's 16 cores instead of the builder's two, then lay them out as the image
does (h200_serve.py copies bundle/fi into place).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(os.environ.get("H200_ROOT", "/tmp/sm90"))
SITE = ROOT / "site"
BUNDLE = ROOT / "bundle"
# Another stack's derivation (vLLM 0.33 with FlashInfer attention, RESULTS §10): its serve spec
# and its rendered tools/ (flashinfer_jit.py and the module table jit-modules.json).
TOOL = Path(os.environ.get("H200_TOOLS", str(BUNDLE / "tools"))) / "flashinfer_jit.py"
SPEC = Path(os.environ.get("H200_SPEC", str(BUNDLE / "serve-spec.json")))


def _spec() -> dict[str, object]:
    spec = json.loads(SPEC.read_text())
    assert isinstance(spec, dict)
    return spec


def _env(spec: dict[str, object], jobs: str = "16") -> dict[str, str]:
    env = spec["env"]
    assert isinstance(env, dict)
    return {**os.environ, **env, "PYTHONPATH": str(SITE), "MAX_JOBS": jobs}


def precompile() -> int:
    spec = _spec()
    modules = spec["jit_modules"]
    assert isinstance(modules, list)
    # Exactly the stack's modules, as its image would hold them: the bundle came from
    # vllm-0.22-sm90's image, whose bf16 attention modules this stack does not derive.
    for kind in ("cached_ops", "aot"):
        for folder in (BUNDLE / "fi" / kind).iterdir():
            if folder.name not in modules:
                print(f"not this stack's: {kind}/{folder.name}", flush=True)
                shutil.rmtree(folder)
    have = {p.name for p in (BUNDLE / "fi" / "cached_ops").iterdir()}
    missing = [m for m in modules if m not in have]
    print(f"derived modules the bundle lacks: {missing}", flush=True)
    if not missing:
        return 0
    workspace = Path(str(spec["jit_dir"]))
    shutil.rmtree(workspace, ignore_errors=True)
    status = subprocess.run(
        [sys.executable, str(TOOL), "precompile", *missing], env=_env(spec)
    ).returncode
    if status != 0:
        return status
    aot = SITE / "flashinfer" / "data" / "aot"
    for name in missing:
        shutil.copytree(workspace / name, BUNDLE / "fi" / "cached_ops" / name)
        shutil.copytree(aot / name, BUNDLE / "fi" / "aot" / name)
    return 0


def verify() -> int:
    spec = _spec()
    modules = spec["jit_modules"]
    assert isinstance(modules, list)
    return subprocess.run(
        [sys.executable, str(TOOL), "verify", *modules], env=_env(spec)
    ).returncode


if __name__ == "__main__":
    sys.exit({"precompile": precompile, "verify": verify}[sys.argv[1]]())
