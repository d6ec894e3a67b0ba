"""Warm caches across hosts, on the GPU machine (issue 24 item 4; bench/RESULTS.md §11).

Two "hosts" in turn on one H200, each a fresh cache folder and fresh processes, laid out as a
pinned host's cache volume (knowledge/cache_volume.yaml, through h200_serve.py --cache-volume):

    python3 bench/h200_warm.py start NAME VOLUME [--fresh]   # serve once; what it compiled
    python3 bench/h200_warm.py capture VOLUME ARTIFACT       # live/ -> cache.tar + files + key
    python3 bench/h200_warm.py restore ARTIFACT VOLUME       # a fresh VOLUME filled from it

The artifact is made and checked by the tool's own code (builder/warm/archive.py repack and
check, builder/warm/key.py with the host's GPU and driver from nvidia-smi through
builder/engine/hostprobe.py); there is no registry or engine on that machine, so the artifact
stays a folder there (the registry and engine path is tests/engine/test_warm.py's). Each
`start` appends a line to $H200_ROOT/results/warm.jsonl: ready time, what the start wrote into
live/ by kind (builder/warm/lifecycle.py compare, the proof `deploy` runs), FlashInfer modules
built, and vLLM's JIT-monitor lines in the server log.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from builder.engine.hostprobe import gather
from builder.knowledge.cache_volume import cache_volume
from builder.warm import archive
from builder.warm.key import WarmKey, gpu_identity, model_of, parallel_shape, serve_identity
from builder.warm.lifecycle import compare
from builder.warm.volume import FileEntry, Listing

ROOT = Path(os.environ.get("H200_ROOT", "/tmp/v033"))
RESULTS = ROOT / "results"
HERE = Path(__file__).resolve().parent


def listing(volume: Path) -> Listing:
    layout = cache_volume()
    live = volume / layout.live
    found: Listing = {}
    for path in sorted(live.rglob("*")) if live.is_dir() else []:
        if not path.is_file() or path.is_symlink():
            continue
        rel = path.relative_to(live).as_posix()
        if layout.skipped(rel):
            continue
        info = path.stat()
        found[rel] = FileEntry(info.st_size, int(info.st_mtime), info.st_mode & 0o7777)
    return found


def start(name: str, volume: Path, fresh: bool, serve_options: list[str]) -> int:
    if fresh:
        shutil.rmtree(volume, ignore_errors=True)
    (volume / cache_volume().live).mkdir(parents=True, exist_ok=True)
    before = listing(volume)
    restored = _restored(volume)
    rc = subprocess.call(
        [
            sys.executable,
            str(HERE / "h200_serve.py"),
            "serve",
            name,
            "--cache-volume",
            str(volume),
            *serve_options,
        ]
    )
    after = listing(volume)
    proof = compare(cache_volume(), before, after, restored)
    summary = _last_summary(name)
    log = (RESULTS / f"{name}.log").read_text(errors="replace")
    line = {
        "name": name,
        "volume": str(volume),
        "rc": rc,
        "ready_s": summary.get("ready_s"),
        "smoke_rc": summary.get("smoke_rc"),
        "files_before": len(before),
        "files_after": len(after),
        "bytes_after": sum(e.size for e in after.values()),
        "restored": proof.restored,
        "compiled_files_by_kind": proof.compiled,
        "rewritten_files": proof.rewritten,
        "new_examples": proof.examples,
        "flashinfer_modules_built_at_serve": summary.get("flashinfer_modules_built_at_serve"),
        "jit_monitor_lines": sum(
            "JIT compilation during inference" in row for row in log.splitlines()
        ),
        "proof": proof.summary(),
    }
    with (RESULTS / "warm.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")
    print(json.dumps(line), flush=True)
    return rc


def capture(volume: Path, folder: Path) -> int:
    layout = cache_volume()
    folder.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    tar = folder / "cache.tar"
    files = archive.repack(_tar_chunks(volume, layout.live), layout.live, tar, layout)
    spec = json.loads((ROOT / "bundle" / "serve-spec.json").read_text())
    key = _key(spec, volume)
    (folder / "files.json").write_text(json.dumps([f.to_json() for f in files]))
    (folder / "key.json").write_text(json.dumps(key.model_dump(), indent=1))
    line = {
        "step": "capture",
        "volume": str(volume),
        "files": len(files),
        "bytes": sum(f.size for f in files),
        "tar_bytes": (folder / "cache.tar").stat().st_size,
        "seconds": round(time.monotonic() - began, 2),
        "key": key.model_dump(),
        "key_digest": key.digest(),
    }
    _record(line)
    return 0


def restore(folder: Path, volume: Path) -> int:
    """A fresh host: VOLUME emptied, the artifact checked whole, unpacked beside live/, moved in."""
    layout = cache_volume()
    began = time.monotonic()
    files = [archive.CapturedFile(**f) for f in json.loads((folder / "files.json").read_text())]
    archive.check(folder / "cache.tar", files)
    checked = time.monotonic() - began
    shutil.rmtree(volume, ignore_errors=True)
    incoming = volume / ".incoming-h200"
    incoming.mkdir(parents=True)
    with tarfile.open(folder / "cache.tar") as tar:
        tar.extractall(incoming, filter="tar")
    incoming.rename(volume / layout.live)
    state = volume / ".sm120-stacks"
    state.mkdir()
    (state / "restored.json").write_text(json.dumps({"artifact": "h200:" + str(folder)}))
    restored = listing(volume)
    line = {
        "step": "restore",
        "artifact": str(folder),
        "volume": str(volume),
        "files": len(files),
        "check_s": round(checked, 2),
        "seconds": round(time.monotonic() - began, 2),
        "mtimes_kept": all(f.path in restored and restored[f.path].mtime == f.mtime for f in files),
    }
    _record(line)
    return 0


def _key(spec: dict[str, object], volume: Path) -> WarmKey:
    facts = gather(None, None)
    names, capability, sms = gpu_identity(facts, None)
    argv = [str(a) for a in spec["argv"]]  # type: ignore[union-attr]
    env = {str(k): str(v) for k, v in spec["env"].items()}  # type: ignore[union-attr]
    serve_hash, covers = serve_identity(argv, env)
    tensor, pipeline = parallel_shape(argv)
    return WarmKey(
        image=os.environ.get("H200_IMAGE_ID", "sha256:" + "0" * 64),
        gpus=names,
        sm_count=sms,
        capability=capability,
        driver=facts.driver,
        model=model_of(argv),
        model_revision="bundle tiny-llama (bench/results/h200-vllm033/commands.txt)",
        serve_hash=serve_hash,
        serve_covers=covers,
        tensor_parallel=tensor,
        pipeline_parallel=pipeline,
        mount=str(volume),
    )


def _tar_chunks(volume: Path, top: str) -> Iterator[bytes]:
    """volume/top as a tar stream, as the engine's archive call gives it (members top/...)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(volume / top, arcname=top)
    yield buffer.getvalue()


def _restored(volume: Path) -> dict[str, object] | None:
    marker = volume / ".sm120-stacks" / "restored.json"
    return json.loads(marker.read_text()) if marker.is_file() else None


def _last_summary(name: str) -> dict[str, object]:
    path = RESULTS / "summary.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return next((r for r in reversed(rows) if r.get("name") == name), {})


def _record(line: dict[str, object]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / "warm.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")
    print(json.dumps(line), flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"]:
        rest = argv[3:]
        mine, options = (
            (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
        )
        return start(argv[1], Path(argv[2]), "--fresh" in mine, options)
    if argv[:1] == ["capture"]:
        return capture(Path(argv[1]), Path(argv[2]))
    if argv[:1] == ["restore"]:
        return restore(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
