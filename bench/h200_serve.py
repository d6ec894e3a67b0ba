"""The sm90 proof on the GPU machine: `vllm serve` as the stack's image runs it, judged by the
project's smoke through `--url` (bench/RESULTS.md §5).

The GPU machine has no Docker engine and takes at most 64 MiB per run, so what the image holds
travels in parts (bench/prepare_h200_bundle.sh): the site tree of the packages the machine
lacks, the FlashInfer modules precompiled on the CPU builder (copied out of the built image),
the model, the stack's serve argv and environment (bench/serve_spec.py), and a snapshot of the
tool. Here the modules are laid out as the image has them: FlashInfer's workspace at the
image's FLASHINFER_WORKSPACE_BASE (cached_ops/<module>/) and the AOT copies in the flashinfer
package; the model at the image's /models path.

    python3 bench/h200_serve.py unpack PART_DIR...          # concatenates and extracts parts
    python3 bench/h200_serve.py serve NAME [--no-fi-cache] [--eager] [--fresh-caches] [--jobs N]
        [--attention-backend NAME] [--env KEY=VALUE]... [--cuda-cache] [--fresh-cuda-cache]
        [--keep-fi-workspace] [--vllm-arg TOKEN]... [--cache-volume DIR]

Each `serve` starts the server, waits for /health, times one streamed request (seconds from
start to the first token), runs `sm120-stacks smoke STACK --url ... --server-log LOG`, stops the
server, and writes NAME.log, NAME-smoke.json and a line in summary.jsonl under $H200_ROOT/results
(H200_ROOT: /tmp/sm90 by default).

For a stack whose lock moves torch past the machine's own (vLLM 0.33: torch 2.14.0), the site
tree carries torch, and `unpack` links the machine's CUDA library wheels (site-packages/nvidia/*,
which torch finds beside itself) into the site tree, unless the bundle carries one of them
(bench/prepare_h200_vllm033.sh).

--attention-backend appends vLLM's option to the stack's command (and is recorded), --vllm-arg
one more token of the command (vLLM 0.33 picks FA2 on sm90 only through
`--attention-config.flash_attn_version 2`: it no longer reads VLLM_FLASH_ATTN_VERSION); --env sets
a variable for the server only. --cuda-cache points the CUDA driver's JIT cache
(CUDA_CACHE_PATH) at $H200_ROOT/caches/cuda, --fresh-cuda-cache empties it first; the summary
line records its size and file count before and after the start. --keep-fi-workspace leaves
FlashInfer's workspace as the last start left it (what that start compiled stays).
--cache-volume DIR lays every cache out as a pinned host's cache volume does (DIR/live/vllm,
triton, inductor, cute-dsl, flashinfer, cuda-driver: knowledge/cache_volume.yaml); H200_TOOL
names the tool tree the smoke runs from (default: the bundle's snapshot).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import requests

ROOT = Path(os.environ.get("H200_ROOT", "/tmp/sm90"))
SITE = ROOT / "site"
BUNDLE = ROOT / "bundle"
CACHES = ROOT / "caches"
RESULTS = ROOT / "results"  # tarred into $OUT at the end ($OUT takes 8 files back)


def unpack(parts: list[str]) -> int:
    """Each part dir holds files named NAME.partNN (concatenated in order) and whole files."""
    BUNDLE.mkdir(parents=True, exist_ok=True)
    pieces: dict[str, list[Path]] = {}
    for folder in parts:
        for item in sorted(Path(folder).iterdir()):
            if ".part" in item.name:
                pieces.setdefault(item.name.split(".part")[0], []).append(item)
            else:
                shutil.copy2(item, BUNDLE / item.name)
    for name, chunks in pieces.items():
        with (BUNDLE / name).open("wb") as sink:
            for chunk in sorted(chunks, key=lambda p: p.name):
                sink.write(chunk.read_bytes())
    for archive in sorted(BUNDLE.glob("*.tar.xz")):
        target = SITE if archive.name.startswith("site") else BUNDLE / archive.name.split(".")[0]
        target.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        if shutil.which("xz") and shutil.which("tar"):  # xz -T0: the blocks of xz -T2 in parallel
            subprocess.run(f"xz -dc -T0 '{archive}' | tar -x -C '{target}'", shell=True, check=True)
        else:
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="tar")
        print(f"unpacked {archive.name} -> {target} in {time.monotonic() - started:.1f} s")
    _link_machine_nvidia()
    return 0


def _link_machine_nvidia() -> None:
    """Torch in the site tree looks for its CUDA libraries in site/nvidia (RUNPATH
    $ORIGIN/../../nvidia/...): link in each of the machine's that the bundle does not carry."""
    if not (SITE / "torch").is_dir():
        return
    import sysconfig

    machine = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    if not machine.is_dir():
        return
    ours = SITE / "nvidia"
    ours.mkdir(exist_ok=True)
    for item in sorted(machine.iterdir()):
        link = ours / item.name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(item)
    print(
        f"linked the machine's CUDA libraries into {ours}: "
        f"{sorted(p.name for p in ours.iterdir() if p.is_symlink())}"
    )


def _place_flashinfer(spec: dict[str, object], with_cache: bool, keep: bool = False) -> None:
    """The image's layout: cached_ops in the workspace, the .so files in FlashInfer's AOT dir."""
    env = spec["env"]
    assert isinstance(env, dict)
    workspace = Path(env["FLASHINFER_WORKSPACE_BASE"])
    if keep:
        return
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir(parents=True)
    aot = SITE / "flashinfer" / "data" / "aot"
    shutil.rmtree(aot, ignore_errors=True)
    if with_cache:
        shutil.copytree(BUNDLE / "fi" / "cached_ops", str(spec["jit_dir"]))
        shutil.copytree(BUNDLE / "fi" / "aot", aot)


def _model_link(spec: dict[str, object]) -> None:
    argv = spec["argv"]
    assert isinstance(argv, list)
    model = Path(argv[2])
    if not model.exists():
        model.parent.mkdir(parents=True, exist_ok=True)
        model.symlink_to(BUNDLE / "model" / "tiny-llama")


def _first_token(url: str, model: str, began: float) -> float | None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is the capital of Kentucky?"}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=120) as r:
        for raw in r.iter_lines():
            if raw.startswith(b"data:") and b'"content"' in raw:
                return time.monotonic() - began
    return None


def _dir_usage(folder: Path) -> dict[str, int]:
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def _values(options: list[str], flag: str) -> list[str]:
    return [options[i + 1] for i, o in enumerate(options) if o == flag and i + 1 < len(options)]


def serve(name: str, options: list[str]) -> int:
    spec = json.loads((BUNDLE / "serve-spec.json").read_text())
    with_cache = "--no-fi-cache" not in options
    eager = "--eager" in options
    jobs = options[options.index("--jobs") + 1] if "--jobs" in options else None
    backend = _values(options, "--attention-backend")
    extra_env = dict(v.split("=", 1) for v in _values(options, "--env"))
    cuda_cache = CACHES.parent / "cuda-cache" if "--cuda-cache" in options else None
    if "--fresh-caches" in options:
        shutil.rmtree(CACHES, ignore_errors=True)
    if cuda_cache is not None and "--fresh-cuda-cache" in options:
        shutil.rmtree(cuda_cache, ignore_errors=True)
    _place_flashinfer(spec, with_cache, keep="--keep-fi-workspace" in options)
    _model_link(spec)
    env = {**os.environ, **spec["env"], **spec["smoke_env"]}
    env.update(
        PYTHONPATH=str(SITE),
        PYTHONUNBUFFERED="1",
        VLLM_CACHE_ROOT=str(CACHES / "vllm"),
        TRITON_CACHE_DIR=str(CACHES / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(CACHES / "inductor"),
    )
    volume = _values(options, "--cache-volume")
    if volume:
        # A pinned host's layout (knowledge/cache_volume.yaml): every cache under DIR/live.
        live = Path(volume[-1]) / "live"
        env.pop("CUDA_CACHE_PATH", None)
        env.update(
            VLLM_CACHE_ROOT=str(live / "vllm"),
            TRITON_CACHE_DIR=str(live / "triton"),
            TORCHINDUCTOR_CACHE_DIR=str(live / "inductor"),
            CUTE_DSL_CACHE_DIR=str(live / "cute-dsl"),
            FLASHINFER_WORKSPACE_BASE=str(live / "flashinfer"),
            CUDA_CACHE_PATH=str(live / "cuda-driver"),
            CUDA_CACHE_MAXSIZE="4294967296",
        )
    if jobs:
        env["MAX_JOBS"] = jobs
    env.update(extra_env)
    if cuda_cache is not None:
        cuda_cache.mkdir(parents=True, exist_ok=True)
        env["CUDA_CACHE_PATH"] = str(cuda_cache)
    ptxas = env.get("TRITON_PTXAS_PATH")
    if ptxas and not Path(ptxas).exists():
        # the image has it; a machine without /usr/local/cuda uses Triton's own (recorded)
        env.pop("TRITON_PTXAS_PATH")
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", *spec["argv"][1:]]
    if eager:
        argv.append("--enforce-eager")
    for value in backend:
        argv += ["--attention-backend", value]
    argv += _values(options, "--vllm-arg")  # any further option, one token per flag
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = RESULTS / f"{name}.log"
    url = f"http://127.0.0.1:{spec['port']}"
    result: dict[str, object] = {
        "name": name,
        "fi_cache": with_cache,
        "eager": eager,
        "max_jobs": env["MAX_JOBS"],
        "argv": argv,
        "extra_env": extra_env,
        "triton_ptxas": env.get("TRITON_PTXAS_PATH", "triton's own (TRITON_PTXAS_PATH unset)"),
    }
    if cuda_cache is not None:
        result["cuda_cache_path"] = str(cuda_cache)
        result["cuda_cache_before"] = _dir_usage(cuda_cache)
    print(f"[{name}] {' '.join(argv)}", flush=True)
    started_at = time.time()
    began = time.monotonic()
    with log.open("w") as sink:
        server = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = began + float(os.environ.get("SERVE_TIMEOUT_S", "420"))
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    result["ready_s"] = round(time.monotonic() - began, 1)
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        if "ready_s" not in result:
            result["error"] = f"not ready (exit {server.poll()})"
            tail = log.read_text(errors="replace").splitlines()[-30:]
            print("\n".join(tail))
            return 1
        first = _first_token(
            url, spec["argv"][spec["argv"].index("--served-model-name") + 1], began
        )
        result["first_token_s"] = None if first is None else round(first, 1)
        smoke_report = RESULTS / f"{name}-smoke.json"
        tool = Path(os.environ.get("H200_TOOL", str(BUNDLE / "tool")))
        smoke = subprocess.run(
            [
                sys.executable,
                "-m",
                "builder",
                "--build-dir",
                str(ROOT / "build"),
                "smoke",
                spec["stack"],
                "--url",
                url,
                "--server-log",
                str(log),
                "--report",
                str(smoke_report),
            ],
            cwd=tool,
            env={**os.environ, "PYTHONPATH": f"{tool}:{SITE}"},
            capture_output=True,
            text=True,
        )
        print(smoke.stdout + smoke.stderr, flush=True)
        result["smoke_rc"] = smoke.returncode
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        workspace = Path(spec["jit_dir"])
        built = [p.parent.name for p in workspace.glob("*/*.so") if p.stat().st_mtime > started_at]
        result["flashinfer_modules_built_at_serve"] = sorted(built)
        if cuda_cache is not None:
            result["cuda_cache_after"] = _dir_usage(cuda_cache)
        result["wall_s"] = round(time.monotonic() - began, 1)
        with (RESULTS / "summary.jsonl").open("a") as summary:
            summary.write(json.dumps(result) + "\n")
        print(json.dumps(result), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "unpack":
        return unpack(argv[1:])
    if argv[0] == "serve":
        return serve(argv[1], argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
