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

Each `serve` starts the server, waits for /health, times one streamed request (seconds from
start to the first token), runs `sm120-stacks smoke STACK --url ... --server-log LOG`, stops the
server, and writes NAME.log, NAME-smoke.json and a line in summary.jsonl under /tmp/sm90/results.
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

ROOT = Path("/tmp/sm90")
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
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="tar")
        print(f"unpacked {archive.name} -> {target} in {time.monotonic() - started:.1f} s")
    return 0


def _place_flashinfer(spec: dict[str, object], with_cache: bool) -> None:
    """The image's layout: cached_ops in the workspace, the .so files in FlashInfer's AOT dir."""
    env = spec["env"]
    assert isinstance(env, dict)
    workspace = Path(env["FLASHINFER_WORKSPACE_BASE"])
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


def serve(name: str, options: list[str]) -> int:
    spec = json.loads((BUNDLE / "serve-spec.json").read_text())
    with_cache = "--no-fi-cache" not in options
    eager = "--eager" in options
    jobs = options[options.index("--jobs") + 1] if "--jobs" in options else None
    if "--fresh-caches" in options:
        shutil.rmtree(CACHES, ignore_errors=True)
    _place_flashinfer(spec, with_cache)
    _model_link(spec)
    env = {**os.environ, **spec["env"], **spec["smoke_env"]}
    env.update(
        PYTHONPATH=str(SITE),
        PYTHONUNBUFFERED="1",
        VLLM_CACHE_ROOT=str(CACHES / "vllm"),
        TRITON_CACHE_DIR=str(CACHES / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(CACHES / "inductor"),
    )
    if jobs:
        env["MAX_JOBS"] = jobs
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", *spec["argv"][1:]]
    if eager:
        argv.append("--enforce-eager")
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = RESULTS / f"{name}.log"
    url = f"http://127.0.0.1:{spec['port']}"
    result: dict[str, object] = {
        "name": name,
        "fi_cache": with_cache,
        "eager": eager,
        "max_jobs": env["MAX_JOBS"],
        "argv": argv,
    }
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
        tool = BUNDLE / "tool"
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
