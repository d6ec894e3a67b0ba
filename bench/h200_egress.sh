#!/usr/bin/env bash
# "No network at start" on vLLM 0.33 on the GPU machine (issue 33 item 2; bench/RESULTS.md §12),
# after the 0.33 bundle is there (bench/h200_vllm033.sh recv/unpack, as in
# bench/results/h200-warm/commands.txt). The machine has no Docker engine, so the server runs as
# bench/h200_serve.py runs it, with the smoke's egress watch (builder/verify/egress_watch.py as
# sitecustomize.py, first on the server's PYTHONPATH: every Python process of the server records
# each connect, datagram send and name lookup to a destination other than loopback, from its
# start to the end of the smoke), then judged by builder/verify/egress.py.
#
#   bash bench/h200_egress.sh [STEP]...  # default: pinned hostip open collect
#   STEP: pinned | hostip | open (one start each, about 2-3 min) | collect (raw output -> $OUT);
#   one call per step where a call must stay under the device's 10 minutes per command
#
# Starts (vllm-0.33-sm90, its serve command and environment as the working tree renders them
# now: bench/serve_spec.py, so the switches of knowledge/serve_switches.yaml are in it):
#   egress-pinned   the stack as pinned: the check must pass (or name what is still open)
#   egress-hostip   the same with VLLM_HOST_IP=127.0.0.1 (vllm/utils/network_utils.py:52-91
#                   get_ip() connects a UDP socket to 8.8.8.8:80 to learn the host's address
#                   unless it is set; the multiproc executor of a TP > 1 serve calls it at
#                   start, the uniproc one only on ROCm: a one-GPU start should not need it)
#   egress-open     control, the switches opened (usage stats on, hub online): the watch must
#                   see the real server's own attempts, so a pass above is not a blind watch
# Raw output: NAME.log, NAME.egress.jsonl (the watch's lines), NAME-egress.txt (the verdict),
# NAME-smoke.json, summary.jsonl; all of it as $OUT/h200-egress.tar.xz.
set -uo pipefail
export H200_ROOT="${H200_ROOT:-/tmp/v033}" PYTHONUNBUFFERED=1 SERVE_TIMEOUT_S="${SERVE_TIMEOUT_S:-420}"
export H200_TOOL="$PWD"
R="$H200_ROOT"
STACK="${EGRESS_STACK:-vllm-0.33-sm90}"
[[ -d "$R/site" && -f "$R/bundle/serve-spec.json" ]] || {
  echo "no unpacked 0.33 bundle under $R: run bench/h200_vllm033.sh recv/unpack first" >&2
  exit 2
}
mkdir -p "$R/results" "$R/egress-watch" "$OUT"
cp builder/verify/egress_watch.py "$R/egress-watch/sitecustomize.py"
# The serve spec as the working tree renders it (the bundle's may predate the pinned switches).
[[ -f "$R/bundle/serve-spec.bundle.json" ]] || cp "$R/bundle/serve-spec.json" "$R/bundle/serve-spec.bundle.json"
PYTHONPATH="$PWD:$R/site" python3 bench/serve_spec.py "$STACK" > "$R/bundle/serve-spec.json" || {
  echo "bench/serve_spec.py $STACK failed" >&2
  exit 2
}
cp "$R/bundle/serve-spec.json" "$R/results/egress-serve-spec.json"

start() {  # NAME [--env K=V]...: one start with the watch, then its verdict
  local name="$1"
  shift
  local events="$R/results/$name.egress.jsonl"
  rm -f "$events"
  python3 bench/h200_serve.py serve "$name" \
    --env PYTHONPATH="$R/egress-watch:$R/site" --env SM120_EGRESS_LOG="$events" "$@"
  PYTHONPATH="$PWD:$R/site" python3 -m builder.verify.egress "$events" | tee "$R/results/$name-egress.txt"
}

collect() {
  tar -C "$R/results" -cJf "$OUT/h200-egress.tar.xz" .
  cp "$R/results/summary.jsonl" "$OUT/" 2>/dev/null || true
  cat "$R/results"/egress-*-egress.txt > "$OUT/egress-verdicts.txt" 2>/dev/null || true
  ls -la "$OUT"
}

[[ $# -gt 0 ]] || set -- pinned hostip open collect
for step in "$@"; do
  case "$step" in
    pinned) start egress-pinned ;;
    hostip) start egress-hostip --env VLLM_HOST_IP=127.0.0.1 ;;
    open) start egress-open --env VLLM_NO_USAGE_STATS=0 --env DO_NOT_TRACK=0 --env HF_HUB_OFFLINE=0 ;;
    collect) collect ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
