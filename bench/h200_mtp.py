"""MTP on an NVFP4 MoE model, served on the GPU machine (issue 44; bench/RESULTS.md §16).

Runs the serve command of stacks/vllm-0.33-sm90-mtp.yaml (bench/serve_spec.py: --moe-backend
marlin, --speculative-config with the draft's moe_backend triton) over the random-weight
checkpoint of tests/support/tinymtp.py, as bench/h200_serve.py runs a stack's command (the
unpacked 0.33 bundle under $H200_ROOT, the image's FlashInfer layout, caches under
$H200_ROOT/caches), then judges what a random-weight model allows:

- shape: each chat/completions answer is a well-formed response with tokens (the text is
  bytes: the weights are random, so no answer is judged for content);
- speculative decoding ran: vLLM's own counters from /metrics (vllm:spec_decode_*), and its
  SpecDecoding log lines;
- which MoE backend each MoE layer got, from vLLM's log (its "Using ... MoE backend" lines);
- runtime compiles by kind (builder.verify.compiles over the server log, FLASHINFER_JIT_VERBOSE
  on as the smoke sets it) and FlashInfer modules built during the start (none expected).

    python3 bench/h200_mtp.py unpack PARTS   # the bundle of bench/prepare_h200_mtp.sh
    python3 bench/h200_mtp.py fi-build       # the serve spec's FlashInfer modules, before starts
    python3 bench/h200_mtp.py serve NAME [--spec FILE] [--sc JSON] [--env K=V]...
    python3 bench/h200_mtp.py collect       # results -> $OUT/h200-mtp.tar.xz, mtp-summary.jsonl

`unpack` takes the folder the parts were copied into (bench/h200_vllm033.sh recv .gpu/pK, one
call each): site.tar.zst.partNN concatenated through zstd (the machine's, else the zstd binary
that travelled in the last part with its liblz4: the machine has none) into $H200_ROOT/site, the
whole files (serve specs, model.tar.xz, a fi.tar.xz where one travelled) into $H200_ROOT/bundle,
then the machine's CUDA library wheels linked in as bench/h200_serve.py does it. `fi-build`
compiles the serve spec's FlashInfer modules there before any start, as the image build does,
into bundle/fi (cached_ops/ and AOT copies), which every start then places as the image has it.

--sc replaces the spec's --speculative-config value (the control: the same server without the
draft's moe_backend). Raw output per start under $H200_ROOT/results-mtp: NAME.log (the
server's), NAME.json (everything judged), a line in summary.jsonl.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import requests

ROOT = Path(os.environ.get("H200_ROOT", "/tmp/v033"))
SITE, BUNDLE, CACHES = ROOT / "site", ROOT / "bundle", ROOT / "caches"
RESULTS = ROOT / "results-mtp"
#: vLLM log lines worth keeping verbatim: backend choices, speculative decoding, compiles.
KEEP = re.compile(
    r"MoE backend|moe_backend|Marlin|marlin|Triton|TRITON|FlashInfer|flashinfer|"
    r"[Ss]pec(ulative|Decoding)|MTP|draft|acceptance|Acceptance|JIT|ninja|nvcc|"
    r"Error|error|Traceback|CUDA graph|cudagraph|compile",
)
PROMPTS = (
    "What is the capital of France? Answer with one word.",
    "What is 17 + 25? Reply with only the number.",
    "What is the capital of Kentucky?",
)


def _value(options: list[str], flag: str) -> str | None:
    return options[options.index(flag) + 1] if flag in options else None


def _values(options: list[str], flag: str) -> list[str]:
    return [options[i + 1] for i, o in enumerate(options) if o == flag and i + 1 < len(options)]


def _place(spec: dict[str, object]) -> None:
    """The image's layout: FlashInfer's workspace with the bundle's modules; the model."""
    env = spec["env"]
    assert isinstance(env, dict)
    workspace = Path(str(env["FLASHINFER_WORKSPACE_BASE"]))
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir(parents=True)
    shutil.copytree(BUNDLE / "fi" / "cached_ops", str(spec["jit_dir"]))
    aot = SITE / "flashinfer" / "data" / "aot"
    shutil.rmtree(aot, ignore_errors=True)
    shutil.copytree(BUNDLE / "fi" / "aot", aot)
    argv = spec["argv"]
    assert isinstance(argv, list)
    model = Path(argv[2])
    if not model.exists():
        model.parent.mkdir(parents=True, exist_ok=True)
        model.symlink_to(BUNDLE / "model" / model.name)


def _ask(url: str, model: str) -> list[dict[str, object]]:
    """Chat and completion requests; each judged for shape only."""
    answers = []
    for prompt in PROMPTS:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 48,
            "temperature": 0,
        }
        answers.append(_shape(requests.post(url + "/v1/chat/completions", json=body, timeout=120)))
    # ignore_eos: a random model may stop at once; these make the draft propose for 96 tokens
    for prompt in PROMPTS[:2]:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": 96,
            "temperature": 0,
            "ignore_eos": True,
        }
        answers.append(_shape(requests.post(url + "/v1/completions", json=body, timeout=120)))
    return answers


def _shape(response: requests.Response) -> dict[str, object]:
    result: dict[str, object] = {"status": response.status_code}
    try:
        data = response.json()
        choice = data["choices"][0]
        text = choice.get("text") if "text" in choice else choice["message"]["content"]
        tokens = data["usage"]["completion_tokens"]
        result |= {
            "ok": response.status_code == 200 and isinstance(text, str) and tokens > 0,
            "completion_tokens": tokens,
            "finish_reason": choice.get("finish_reason"),
            "text_repr": repr(text)[:120],
        }
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        result |= {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "body": response.text[:300],
        }
    return result


def _metrics(url: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters (and the generation token count beside them)."""
    found: dict[str, float] = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:spec_decode") or line.startswith("vllm:generation_tokens"):
            name, _, value = line.rpartition(" ")
            try:
                found[name] = float(value)
            except ValueError:
                continue
    return found


def serve(name: str, options: list[str]) -> int:
    spec = json.loads((BUNDLE / (_value(options, "--spec") or "serve-spec-mtp.json")).read_text())
    _place(spec)
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", *spec["argv"][1:]]
    replaced = _value(options, "--sc")
    if replaced is not None:
        argv[argv.index("--speculative-config") + 1] = replaced
    env = {**os.environ, **spec["env"], **spec["smoke_env"]}
    env.update(
        PYTHONPATH=str(SITE),
        PYTHONUNBUFFERED="1",
        VLLM_CACHE_ROOT=str(CACHES / "vllm"),
        TRITON_CACHE_DIR=str(CACHES / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(CACHES / "inductor"),
        CUDA_CACHE_PATH=str(CACHES / "cuda"),
        MAX_JOBS="16",
    )
    env.update(dict(v.split("=", 1) for v in _values(options, "--env")))
    if not Path(env.get("TRITON_PTXAS_PATH", "/")).exists():
        env.pop("TRITON_PTXAS_PATH", None)
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = RESULTS / f"{name}.log"
    url = f"http://127.0.0.1:{spec['port']}"
    result: dict[str, object] = {"name": name, "argv": argv[3:], "started": time.time()}
    print(f"[{name}] {' '.join(argv)}", flush=True)
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
            print("\n".join(log.read_text(errors="replace").splitlines()[-40:]))
            return 1
        before = _metrics(url)
        answers = _ask(url, spec["argv"][spec["argv"].index("--served-model-name") + 1])
        time.sleep(11)  # one stats interval: vLLM logs its SpecDecoding line every 10 s
        after = _metrics(url)
        result |= {
            "answers": answers,
            "shape_ok": all(a.get("ok") for a in answers),
            "metrics_before": before,
            "metrics_after": after,
        }
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        result["wall_s"] = round(time.monotonic() - began, 1)
        text = log.read_text(errors="replace")
        sys.path[:0] = [str(Path.cwd()), str(SITE)]  # the tool; pydantic and yaml from the site
        from builder.verify.compiles import find_compiles

        findings = find_compiles(text)
        result["runtime_compiles"] = [
            {"kind": k.kind, "compiles": k.compiles, "loads": k.loads, "names": k.names[:20]}
            for k in findings.kinds
        ]
        workspace = Path(str(spec["jit_dir"]))
        started = float(str(result["started"]))
        result["flashinfer_modules_built_at_serve"] = sorted(
            p.parent.name for p in workspace.glob("*/*.so") if p.stat().st_mtime > started
        )
        result["log_lines"] = [line[:400] for line in text.splitlines() if KEEP.search(line)][:200]
        (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        summary = {k: v for k, v in result.items() if k not in ("answers", "log_lines")}
        with (RESULTS / "summary.jsonl").open("a") as sink:
            sink.write(json.dumps(summary) + "\n")
        print(json.dumps(summary), flush=True)
    return 0


def unpack(parts: Path) -> int:
    """The zstd site stream first, then the small files; times each step (unpack.txt)."""
    BUNDLE.mkdir(parents=True, exist_ok=True)
    SITE.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    lines = []
    chunks = sorted(parts.glob("site.tar.zst.part*"))
    zstd = shutil.which("zstd") or str(parts / "zstd")
    env = {**os.environ, "LD_LIBRARY_PATH": str(parts)} if zstd == str(parts / "zstd") else None
    began = time.monotonic()
    # zstd -d takes each named file as a frame of its own: the parts go in as one stream
    with subprocess.Popen(["cat", *map(str, chunks)], stdout=subprocess.PIPE) as cat:
        unzstd = subprocess.Popen(
            [zstd, "-d", "-q", "--long=27", "-c"],
            stdin=cat.stdout,
            stdout=subprocess.PIPE,
            env=env,
        )
        tar = subprocess.run(["tar", "-x", "-C", str(SITE)], stdin=unzstd.stdout)
        unzstd.wait()
    if cat.returncode or unzstd.returncode or tar.returncode:
        codes = (cat.returncode, unzstd.returncode, tar.returncode)
        print(f"site: cat, zstd, tar exit {codes}", file=sys.stderr)
        return 1
    lines.append(f"site: {len(chunks)} parts through {zstd} in {time.monotonic() - began:.1f} s")
    for item in sorted(parts.iterdir()):
        if item.name.endswith((".json", ".txt")):
            shutil.copy2(item, BUNDLE / item.name)
        elif item.name.endswith(".tar.xz"):
            target = BUNDLE / item.name.split(".")[0]
            target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(item) as archive:
                archive.extractall(target, filter="tar")
            lines.append(f"{item.name} -> {target}")
    sys.path.insert(0, str(Path(__file__).parent))
    os.environ["H200_ROOT"] = str(ROOT)
    import h200_serve

    h200_serve._link_machine_nvidia()
    (RESULTS / "unpack.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


def fi_build() -> int:
    """Compile the serve spec's FlashInfer modules before any start, as the image build does
    (the CPU builder lacks curand.h and torch 2.14's CUDA libraries): into the spec's
    workspace, then kept as bundle/fi/cached_ops and as FlashInfer AOT copies (bundle/fi/aot)."""
    spec = json.loads((BUNDLE / "serve-spec.json").read_text())
    env = {**os.environ, **spec["env"], "PYTHONPATH": str(SITE), "MAX_JOBS": "16"}
    names = [str(n) for n in spec["jit_modules"]]
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    module = importlib.import_module(f'flashinfer.jit.{name}')\n"
        "    spec = getattr(module, f'gen_{name}_module')()\n"
        "    spec.build()\n"
        "    print('built', spec.name, flush=True)\n"
    )
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, *names], env=env)
    took = time.monotonic() - began
    jit_dir = Path(str(spec["jit_dir"]))
    fi = BUNDLE / "fi"
    shutil.rmtree(fi, ignore_errors=True)
    shutil.copytree(jit_dir, fi / "cached_ops")
    for name in names:
        (fi / "aot" / name).mkdir(parents=True)
        shutil.copy2(jit_dir / name / f"{name}.so", fi / "aot" / name / f"{name}.so")
    line = f"fi-build {names}: exit {done.returncode} in {took:.1f} s (MAX_JOBS=16)"
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / "unpack.txt").open("a") as sink:
        sink.write(line + "\n")
    print(line, flush=True)
    return done.returncode


def collect() -> int:
    out = Path(os.environ["OUT"])
    with tarfile.open(out / "h200-mtp.tar.xz", "w:xz") as tar:
        tar.add(RESULTS, arcname="h200-mtp")
    shutil.copy(RESULTS / "summary.jsonl", out / "mtp-summary.jsonl")
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "serve":
        return serve(argv[1], argv[2:])
    if argv and argv[0] == "unpack" and len(argv) == 2:
        return unpack(Path(argv[1]))
    if argv and argv[0] == "fi-build":
        return fi_build()
    if argv and argv[0] == "collect":
        return collect()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
