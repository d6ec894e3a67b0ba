#!/usr/bin/env bash
# Warm caches across hosts on the GPU machine (bench/RESULTS.md §11), after the 0.33 bundle is
# there (bench/h200_vllm033.sh recv/unpack, commands in bench/results/h200-warm/commands.txt).
#
#   bench/h200_warm.sh first     # host A: cold start, capture, warm restart (the reference)
#   bench/h200_warm.sh second    # host B: a fresh volume at A's path, restored, started;
#                                #   host C: restored at another path, started; results -> $OUT
set -uo pipefail
export H200_ROOT="${H200_ROOT:-/tmp/v033}" PYTHONUNBUFFERED=1 SERVE_TIMEOUT_S="${SERVE_TIMEOUT_S:-420}"
export H200_TOOL="$PWD" H200_IMAGE_ID="${H200_IMAGE_ID:-sha256:00aa2aff290c4eed57a47e82cd43668016b2621e52cdcb21366f73ea629dc340}"
R="$H200_ROOT"
W=(env PYTHONPATH="$PWD:$R/site" python3 bench/h200_warm.py)
VOL="$R/vol" MOVED="$R/vol-moved" ART="$R/artifact"
case "${1:?phase}" in
  first)
    "${W[@]}" start warm-a-cold "$VOL" --fresh
    "${W[@]}" capture "$VOL" "$ART"
    "${W[@]}" start warm-a-restart "$VOL"
    mkdir -p "$OUT" && cp "$R/results/warm.jsonl" "$OUT/" 2>/dev/null || true
    ;;
  second)
    "${W[@]}" restore "$ART" "$VOL"
    "${W[@]}" start warm-b-restored "$VOL"
    "${W[@]}" restore "$ART" "$MOVED"
    "${W[@]}" start warm-c-moved "$MOVED"
    mkdir -p "$OUT"
    tar -C "$R/results" -cJf "$OUT/h200-warm.tar.xz" .
    cp "$R/results/warm.jsonl" "$R/results/summary.jsonl" "$OUT/" 2>/dev/null || true
    ls -la "$OUT"
    ;;
  fa2)
    # FA2 from its sm_80 PTX: the CUDA driver's JIT cache (CUDA_CACHE_PATH in live/cuda-driver).
    FA2=(-- --attention-backend FLASH_ATTN --vllm-arg --attention-config.flash_attn_version=2)
    "${W[@]}" start fa2-a-cold "$R/vol-fa2" --fresh "${FA2[@]}"
    "${W[@]}" capture "$R/vol-fa2" "$R/artifact-fa2"
    "${W[@]}" restore "$R/artifact-fa2" "$R/vol-fa2"
    SERVE_TIMEOUT_S=200 "${W[@]}" start fa2-b-restored "$R/vol-fa2" "${FA2[@]}"
    mkdir -p "$OUT"
    tar -C "$R/results" -cJf "$OUT/h200-warm-fa2.tar.xz" .
    cp "$R/results/warm.jsonl" "$OUT/" 2>/dev/null || true
    ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
