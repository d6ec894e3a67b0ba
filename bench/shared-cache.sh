#!/usr/bin/env bash
# The build cache shared through the registry, measured (bench/RESULTS.md, "Shared build cache"):
#
# 1. this machine's engine builds ci-mini (FROM its base pushed to the registry, so a second
#    machine can pull the same base) with inline cache metadata, and pushes it;
# 2. a fresh engine (scripts/fleet-netns.sh: its own network namespace and empty data root, no
#    way out but the registry) builds a variant of ci-mini with another serve port, with
#    --cache-from-registry: no step runs, the FlashInfer precompile included; its layers come
#    from the registry.
#
# Nothing of this machine's engine is pruned or removed but the tags made here; the fresh
# engine is torn down afterwards (and the main engine checked) unless KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."

REGISTRY=${REGISTRY:-127.0.0.1:5000}
NAMESPACE=sm120-cache-bench
BASE=local/cuda:13.0.2-devel-bookworm
PUSHED_BASE=$REGISTRY/$NAMESPACE/cuda:13.0.2-devel-bookworm
WORK=${WORK:-$(mktemp -d /tmp/sm120-cache-bench.XXXXXX)}
OUT=${OUT:-bench/results/shared-cache}
CLI=$PWD/.venv/bin/sm120-stacks
mkdir -p "$OUT"

started_fleet=0
cleanup() {
    if [[ $started_fleet == 1 && ${KEEP:-0} != 1 ]]; then scripts/fleet-netns.sh down; fi
}
trap cleanup EXIT

if [[ ! -S /run/sm120-fleet/h1/docker.sock ]]; then
    scripts/fleet-netns.sh up 1 >/dev/null
    started_fleet=1
fi
FRESH=unix:///run/sm120-fleet/h1/docker.sock

# A workspace: ci-mini as committed, and the variant (another serve port: the runtime stage's
# EXPOSE and CMD change, every layer stays what it was).
. bench/workspace.sh
bench_workspace "$WORK" ci-mini-port8001 $'extends: ci-mini\nserve:\n  port: 8001\n'
SUB=(--substitute-base "$BASE=$PUSHED_BASE")

echo "== 1. this machine: base to the registry, ci-mini built with inline cache and pushed"
docker tag "$BASE" "$PUSHED_BASE"
t0=$(date +%s.%N)
docker push -q "$PUSHED_BASE" >/dev/null
t1=$(date +%s.%N)
(cd "$WORK" && "$CLI" "${SUB[@]}" build ci-mini) | tee "$OUT/1-build-ci-mini.txt"
t2=$(date +%s.%N)
(cd "$WORK" && "$CLI" "${SUB[@]}" push ci-mini --force --registry "$REGISTRY/$NAMESPACE") |
    tee "$OUT/1-push-ci-mini.txt"
t3=$(date +%s.%N)

echo "== 2. fresh engine ($FRESH): the variant, cache from the registry"
DOCKER_HOST=$FRESH docker images --format '{{.Repository}}:{{.Tag}}' | tee "$OUT/2-fresh-images-before.txt"
DOCKER_HOST=$FRESH docker system df | tee "$OUT/2-fresh-df-before.txt"
t4=$(date +%s.%N)
(cd "$WORK" && "$CLI" "${SUB[@]}" build ci-mini-port8001 --engine "$FRESH" \
    --cache-from-registry "$REGISTRY/$NAMESPACE") | tee "$OUT/2-build-variant.txt"
t5=$(date +%s.%N)
log=$(ls -t "$WORK"/build/ci-mini-port8001/logs/*.log | head -1)
cp "$log" "$OUT/2-build-variant.log"

echo "== figures"
{
    printf 'base push (%s): %.1f s\n' "$PUSHED_BASE" "$(echo "$t1 - $t0" | bc)"
    printf 'ci-mini build here: %.1f s, push: %.1f s\n' "$(echo "$t2 - $t1" | bc)" "$(echo "$t3 - $t2" | bc)"
    printf 'variant build on the fresh engine: %.1f s\n' "$(echo "$t5 - $t4" | bc)"
    echo "build steps of the variant (after FROM): $(grep -E '^#[0-9]+ \[[a-z-]+ [0-9]+/[0-9]+\]' "$log" | grep -vc '\] FROM '), CACHED: $(grep -cE '^#[0-9]+ CACHED' "$log")"
    echo "build steps that ran (not CACHED):"
    ran=0
    for id in $(grep -E '^#[0-9]+ \[[a-z-]+ [0-9]+/[0-9]+\]' "$log" | grep -v '\] FROM ' | cut -d' ' -f1 | sort -u); do
        if ! grep -qE "^$id CACHED" "$log"; then
            echo "  $(grep -m1 -E "^$id \[" "$log" | cut -c1-120)"
            ran=$((ran + 1))
        fi
    done
    if [[ $ran == 0 ]]; then echo "  none"; fi
    echo "precompile step: $(grep -A2 -E '^#[0-9]+ \[jit-cache' "$log" | grep -E 'CACHED|DONE' | head -1)"
    echo "flashinfer_jit output lines (a compile would print them): $(grep -c 'flashinfer_jit:' "$log" || true)"
    echo "fresh engine afterwards:"
    DOCKER_HOST=$FRESH docker system df
} | tee "$OUT/figures.txt"

docker rmi "$PUSHED_BASE" >/dev/null || true
