#!/usr/bin/env bash
# Issue 27 on four GPUs: stacks/vllm-0.33-sm90-tp2pp2 (seed 003's tensor parallel 2 x pipeline
# parallel 2, its NCCL and worker environment, NVLink multicast off) on an nvidia-h200-x4
# machine, through the project's harness. Prepared on the CPU builder, not yet run: no machine of
# four GPUs was lent when it was written (bench/RESULTS.md, "Four GPUs").
#
# On the build machine (what travels is made as for the one-GPU 0.33 proof, RESULTS §10):
#   bench/h200x4_tp2pp2.sh prepare IMAGE [COMMIT]
#     IMAGE: a built image of vllm-0.33-sm90 or of this stack (the same lock and FlashInfer
#     modules: checked); parts in .gpu/x4-p1..x4-pN (bench/prepare_h200_vllm033.sh, run from a
#     snapshot of COMMIT so that other runs' .gpu/pN stay), the model swapped for the 4-layer
#     tiny Llama (bench/make_tiny_llama_tp2pp2.py) as bundle/model/tiny-llama. A part and the
#     working tree travel together within 64 MiB: PART_BYTES=50000000 where the tree has grown
#     (bench/results/h200-warm/commands.txt re-split into 50 MB parts for that).
# On the x4 machine, one device call each (the machine keeps /tmp only while it stays warm):
#   bench/h200x4_tp2pp2.sh recv .gpu/x4-pN   # every part (carry it); the last: recv, then unpack
#   bench/h200x4_tp2pp2.sh unpack            # bench/h200_vllm033.sh unpack + torchcheck; NCCL
#                                            #   2.30 from $NCCL_PART as in h200-warm/commands.txt
#   bench/h200x4_tp2pp2.sh first             # nccl4, doctor, cold, capture, restart
#   bench/h200x4_tp2pp2.sh second            # restore, restored, collect -> $OUT
#   (or any single step below; `all` is first then second, for a machine that allows 20 min)
#
# Steps:
#   nccl4     one NCCL all-reduce over the four GPUs, a process each, with the stack's env
#   doctor    the topology as doctor reads it, saved in tests/fixtures/topology/'s layout
#             (results/topology/), then the tool's `doctor --stack` (no engine there: its engine
#             and runtime lines fail; the tp lines are the point)
#   cold      serve with the stack's own command on a fresh cache volume (h200_serve.py through
#             h200_warm.py start): /health, first token, `smoke STACK --url`, what was compiled
#   capture   live/ -> artifact (the tool's repack and key), then which ranks' torch.compile
#             folders it holds (builder/warm/ranks.py): exit 1 unless rank_0_0..rank_3_0 are all
#   restart   the warm restart of the same volume (the reference for `restored`)
#   restore   the refusal check (GPUs here >= TP x PP, builder/warm/ranks.py require_gpus), then
#             the artifact checked and unpacked into a fresh volume
#   restored  serve from the restored volume: the proof must be zero compiles on every rank
#   collect   results -> $OUT/h200x4-tp2pp2.tar.xz (+ warm.jsonl, summary.jsonl)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
STACK=vllm-0.33-sm90-tp2pp2
export H200_ROOT="${H200_ROOT:-/tmp/v033}" PYTHONUNBUFFERED=1
export SERVE_TIMEOUT_S="${SERVE_TIMEOUT_S:-540}" H200_TOOL="${H200_TOOL:-$PWD}"
# NVLink multicast stays off on the lent machines (the device notes; the stack sets them too).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R="$H200_ROOT"
RES="$R/results"
VOL="$R/vol" FRESH="$R/vol-restored" ART="$R/artifact"
PY=(env PYTHONPATH="$H200_TOOL:$R/site" python3)
W=("${PY[@]}" "$here/h200_warm.py")

prepare() {
  local image="${1:?usage: bench/h200x4_tp2pp2.sh prepare IMAGE [COMMIT]}"
  local main work tree commit
  main="$(cd "$here/.." && pwd)"
  commit="$(git -C "$main" rev-parse "${2:-HEAD}")" || return 2
  work="${WORK:-/work/gpuwork-$STACK}"
  cd "$main" || return 2
  # The image's FlashInfer modules serve this stack only if both stacks want the same ones.
  .venv/bin/python - "$STACK" <<'PY' || return 2
import json, subprocess, sys
specs = [json.loads(subprocess.check_output([".venv/bin/python", "bench/serve_spec.py", s]))
         for s in ("vllm-0.33-sm90", sys.argv[1])]
same = [(s["jit_dir"], s["jit_modules"]) for s in specs]
if same[0] != same[1]:
    sys.exit(f"error: the FlashInfer modules differ from vllm-0.33-sm90's: {same}")
print("FlashInfer modules as vllm-0.33-sm90's:", same[0])
PY
  # prepare_h200_vllm033.sh empties .gpu/ of the tree it runs from: run it from a snapshot of
  # COMMIT, so that other runs' parts in this working tree's .gpu/ stay; ours move in as x4-pN.
  tree="$work/tree"
  rm -rf "$tree" && mkdir -p "$tree" && git -C "$main" archive "$commit" | tar -x -C "$tree"
  ln -s "$main/.venv" "$tree/.venv"
  GIT_DIR="$main/.git" WORK="$work" bash "$tree/bench/prepare_h200_vllm033.sh" \
    "$STACK" "$image" "$commit" || return 1
  rm -rf "$work/model" && PYTHONPATH="$work/tool-src" .venv/bin/python \
    "$work/tool-src/bench/make_tiny_llama_tp2pp2.py" "$work/model/tiny-llama" || return 1
  tar -C "$work/model" -cJf "$work/model.tar.xz" tiny-llama
  local part last
  last="$(find "$tree/.gpu" -name model.tar.xz -printf '%h\n' | head -1)"
  cp "$work/model.tar.xz" "$last/model.tar.xz"
  mkdir -p .gpu
  for part in "$tree"/.gpu/p*; do
    rm -rf ".gpu/x4-${part##*/}" && mv "$part" ".gpu/x4-${part##*/}"
  done
  du -sb .gpu/x4-p* | tee "$work/parts.txt"
  echo "carry each .gpu/x4-pN in its own run: bench/h200x4_tp2pp2.sh recv .gpu/x4-pN"
}

nccl4() {
  # A file, not stdin: spawned processes import the main module again by its path.
  cat >"$RES/nccl4.py" <<'PY'
"""One all-reduce over every GPU, a process each (NCCL; --cpu: gloo on 4 CPU processes)."""
import os, sys, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp
ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
def work(rank: int, world: int, init: str, cpu: bool) -> None:
    os.environ.update(ENV)
    if not cpu:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if cpu else "nccl", init_method=init, rank=rank, world_size=world)
    t = torch.full((1024,), float(rank + 1), device="cpu" if cpu else "cuda")
    dist.all_reduce(t)
    if not cpu:
        torch.cuda.synchronize()
    print(f"rank {rank}: all_reduce sum {t[0].item()} (want {world * (world + 1) / 2})", flush=True)
    dist.destroy_process_group()
if __name__ == "__main__":
    cpu = "--cpu" in sys.argv
    world = 4 if cpu else torch.cuda.device_count()
    nccl = None if cpu else torch.cuda.nccl.version()
    print("torch", torch.__version__, "nccl", nccl, "processes", world, ENV, flush=True)
    mp.spawn(work, args=(world, f"file://{tempfile.mktemp()}", cpu), nprocs=world)
PY
  "${PY[@]}" "$RES/nccl4.py" "$@" 2>&1 | tee "$RES/nccl4.txt"
  return "${PIPESTATUS[0]}"
}

doctor() {
  local topo="$RES/topology"
  mkdir -p "$topo"
  # The one GPU query doctor sends (builder/engine/hostprobe.py GPU_QUERY).
  nvidia-smi --query-gpu=index,pci.bus_id,driver_version,compute_cap,name \
    --format=csv,noheader,nounits >"$topo/gpus.csv"
  nvidia-smi topo -m >"$topo/topo-m.txt"
  nvidia-smi topo -p2p r >"$topo/p2p-r.txt"
  nvidia-smi topo -p2p w >"$topo/p2p-w.txt"
  cat /proc/cmdline >"$topo/cmdline"
  if command -v lspci >/dev/null; then lspci -D -vvv >"$topo/lspci.txt" 2>&1; fi
  {
    echo "units: [$(ls /sys/class/iommu 2>/dev/null | paste -sd, -)]"
    echo "groups:"
    while IFS=', ' read -r _ bus _; do
      bus="$(tr 'A-F' 'a-f' <<<"${bus#0000}")"
      f="/sys/bus/pci/devices/$bus/iommu_group/type"
      [[ -r "$f" ]] && echo "  \"$bus\": $(cat "$f")"
    done <"$topo/gpus.csv"
  } >"$topo/iommu.yaml"
  (cd "$H200_TOOL" && "${PY[@]}" -m builder --build-dir "$R/build" doctor --stack "$STACK") \
    2>&1 | tee "$RES/doctor.txt"
  return 0  # its engine and runtime lines fail without Docker; the record is the point
}

ranks_of_artifact() {
  "${PY[@]}" - "$ART" "$RES/ranks.json" <<'PY'
import json, sys
from builder.warm import ranks
from builder.warm.archive import CapturedFile
art, out = sys.argv[1], sys.argv[2]
files = [CapturedFile(**f) for f in json.load(open(f"{art}/files.json"))]
key = json.load(open(f"{art}/key.json"))
held = ranks.held_ranks(f.path for f in files)
missing = ranks.missing_ranks(key["tensor_parallel"], key["pipeline_parallel"], held)
line = {"step": "ranks", "tp": key["tensor_parallel"], "pp": key["pipeline_parallel"],
        "gpus": key["gpus"], "ranks": ranks.ranks_summary((f.path, f.size) for f in files),
        "missing": missing}
json.dump(line, open(out, "w"), indent=1)
print(json.dumps(line))
sys.exit(1 if missing or not held else 0)
PY
}

restore_checked() {
  "${PY[@]}" - "$ART" <<'PY' || return 2
import json, sys
from builder.errors import StackError
from builder.engine.hostprobe import gather
from builder.warm import ranks
key = json.load(open(f"{sys.argv[1]}/key.json"))
gpus = len(gather(None, None).gpus)
try:
    ranks.require_gpus("this machine", key["tensor_parallel"], key["pipeline_parallel"], gpus)
except StackError as exc:
    sys.exit(f"error: {exc.message}")
print(f"{gpus} GPUs here for TP {key['tensor_parallel']} x PP {key['pipeline_parallel']}: restore")
PY
  "${W[@]}" restore "$ART" "$FRESH"
}

collect() {
  mkdir -p "$OUT"
  tar -C "$RES" -cJf "$OUT/h200x4-tp2pp2.tar.xz" .
  cp "$RES/warm.jsonl" "$RES/summary.jsonl" "$RES/ranks.json" "$OUT/" 2>/dev/null || true
  ls -la "$OUT"
}

run_step() {
  local name="$1"
  shift
  case "$name" in
    torchcheck) bash "$here/h200_vllm033.sh" torchcheck ;;
    nccl4) nccl4 "$@" ;;
    doctor) doctor ;;
    cold) "${W[@]}" start tp2pp2-cold "$VOL" --fresh ;;
    capture) "${W[@]}" capture "$VOL" "$ART" && ranks_of_artifact ;;
    restart) "${W[@]}" start tp2pp2-warm-restart "$VOL" ;;
    restore) restore_checked ;;
    restored) "${W[@]}" start tp2pp2-restored "$FRESH" ;;
    collect) collect ;;
    *) echo "unknown step $name" >&2; return 2 ;;
  esac
}

step="${1:?step: prepare, recv, unpack, first, second, all, or one step (see the header)}"
shift
[[ "$step" == prepare ]] && { prepare "$@"; exit $?; }
mkdir -p "$RES"
case "$step" in
  recv) bash "$here/h200_vllm033.sh" recv "$@" ;;
  unpack)
    bash "$here/h200_vllm033.sh" unpack || exit 1
    if [[ -n "${NCCL_PART:-}" ]]; then  # torch 2.14 needs NCCL 2.30 (RESULTS §10)
      rm -rf "$R/site/nvidia/nccl" && xz -dc -T0 "$NCCL_PART" | tar -x -C "$R/site" nvidia/nccl
      bash "$here/h200_vllm033.sh" torchcheck
    fi
    ;;
  first) for s in nccl4 doctor cold capture restart; do run_step "$s" || echo "step $s failed: $?"; done ;;
  second) for s in restore restored collect; do run_step "$s" || echo "step $s failed: $?"; done ;;
  all) bash "$0" first && bash "$0" second ;;
  *) run_step "$step" "$@" ;;
esac
