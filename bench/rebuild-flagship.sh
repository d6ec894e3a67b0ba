#!/usr/bin/env bash
# Issue 46 on the front door (bench/RESULTS.md §14; `make bench-rebuild STACK=vllm-0.33-marlin`):
# the flagship's local variant (scripts/flagship-local.sh's: Debian 12's Python 3.11 on the local
# CUDA base, the flagship's pins) built cold and then four rebuilds, side by side in one run:
#
#  1. cold: the local variant with one toolchain variable of this run's own, so its toolchain,
#     FlashInfer compile inputs, compile step and cache mount are new and every kernel compiles;
#  2. a child adding one unrelated package (humanize: FlashInfer and vLLM import nothing of it);
#  3. a serve-argument child (another port: only the runtime stage changes);
#  4. a transformers bump (the nearest stand-in for a vLLM bump that keeps torch and FlashInfer);
#  5. a no-op of the cold stack, 5 pairs against BuildKit's own no-op of the same context.
#
# Each child is locked from the parent's lock (--versions-from), so only its change moves. The
# base is the local CUDA base by content (its id-tag): another `make base-cuda-local` cannot move
# it. disk.txt samples `df /` every 30 s: the run must stay below 85% (issue 46). Nothing is
# pruned or removed; the images keep their tags in the scratch workspace's names.
#
# REUSE_WORK=1 with the WORK of an earlier run builds the same four stacks again with this
# checkout's code, keeping their manifests and locks (the first build of the parent then runs
# only what this checkout renders differently): a second pass after a change to the stages,
# PARENT_LABEL naming that first build in the tables.
set -euo pipefail
cd "$(dirname "$0")/.."

STACK=${STACK:?usage: STACK=vllm-0.33-marlin bench/rebuild-flagship.sh}
WORK=${WORK:-$(mktemp -d /tmp/sm120-rebuild-flagship.XXXXXX)}
OUT=${OUT:-$PWD/bench/results/rebuild-economy/flagship}
CLI=$PWD/.venv/bin/sm120-stacks
export PYTHONPATH=$PWD
PY=$PWD/.venv/bin/python
RUN_ID=${RUN_ID:-$(date -u +%Y%m%dT%H%M%S)-$$}
export SM120_STACKS_BASE_SUBSTITUTE="nvidia/cuda:13.0.2-devel-ubuntu24.04=local/cuda:13.0.2-devel-bookworm"
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.buildkit.log "$OUT"/*.md
SECONDS=0
. bench/workspace.sh

parent=$STACK-local-rebuild
six=$parent-humanize
serve=$parent-serve
bump=$parent-transformers

if [[ ${REUSE_WORK:-0} != 1 ]]; then  # (not indented: the here-document below)
# The scratch workspace: every committed manifest (the parent's extends chain), the flagship's
# lock, the wheels and patches linked in, and the four manifests of this run.
mkdir -p "$WORK/stacks" "$WORK/build"
cp stacks/*.yaml "stacks/$STACK.lock" "$WORK/stacks/"
ln -sfn "$PWD/build/wheels" "$WORK/build/wheels"
ln -sfn "$PWD/patches" "$WORK/patches"
scripts/flagship-local.sh --variant-only "$STACK" "$WORK/stacks"
printf '# %s with a toolchain variable of this run'"'"'s own: its compile runs cold.\n%s\n' \
    "$STACK-local" "extends: $STACK-local" >"$WORK/stacks/$parent.yaml"
printf 'build:\n  toolchain_env:\n    SM120_REBUILD_BENCH_RUN: "%s"\n' "$RUN_ID" >>"$WORK/stacks/$parent.yaml"
printf 'extends: %s\npython:\n  packages:\n    humanize: 4.12.3\n' "$parent" >"$WORK/stacks/$six.yaml"
printf 'extends: %s\nserve:\n  port: 8001\n' "$parent" >"$WORK/stacks/$serve.yaml"
printf 'extends: %s\npython:\n  packages:\n    transformers: %s\n' "$parent" "${BUMP_TRANSFORMERS:-5.20.1}" \
    >"$WORK/stacks/$bump.yaml"

fi

# The disk, every 30 s, for as long as the run lives.
(while sleep 30; do printf '%s %s\n' "$(date -u +%T)" "$(df --output=pcent,used,avail / | tail -n 1)"; done) \
    >>"$OUT/disk.txt" &
sampler=$!
trap 'kill $sampler 2>/dev/null || true' EXIT

if [[ ${REUSE_WORK:-0} != 1 ]]; then
must lock-parent "$CLI" lock "$parent" --versions-from "stacks/$STACK.lock"
for child in "$six" "$serve" "$bump"; do
    must "lock-${child#"$parent"-}" "$CLI" lock "$child" --versions-from "stacks/$parent.lock"
done
fi
must check-parent "$CLI" check "$parent"

newest() {  # the newest file of NAME's build logs with SUFFIX (.log, .command.sh)
    ls -t "$WORK/build/$1/logs/"*"$2" | head -n 1
}

must build-parent "$CLI" build "$parent"
cp "$(newest "$parent" .log)" "$OUT/parent.buildkit.log"
command_sh=$(newest "$parent" .command.sh)
must build-child "$CLI" build "$six"
cp "$(newest "$six" .log)" "$OUT/child-humanize.buildkit.log"
must build-serve "$CLI" build "$serve"
cp "$(newest "$serve" .log)" "$OUT/child-serve.buildkit.log"
must build-transformers "$CLI" build "$bump"
cp "$(newest "$bump" .log)" "$OUT/child-transformers.buildkit.log"
must build-noop "$CLI" build "$parent"
"$PY" bench/rebuild_economy.py --steps \
    "${PARENT_LABEL:-cold}=$OUT/parent.buildkit.log" "one-package child=$OUT/child-humanize.buildkit.log" \
    "serve-argument child=$OUT/child-serve.buildkit.log" \
    "transformers bump=$OUT/child-transformers.buildkit.log" | tee "$OUT/steps.md"
noop_pairs "$parent" "$command_sh"
"$PY" bench/rebuild_economy.py \
    "$parent (${PARENT_LABEL:-cold})=$OUT/parent.buildkit.log" "$six (one unrelated package)=$OUT/child-humanize.buildkit.log" \
    | tee "$OUT/jit-steps.md"
# What each image holds that no other does (UNIQUE SIZE): a child's own layers on disk.
docker system df -v | sed -n "/^REPOSITORY/p;/ $parent/p" >"$OUT/image-sizes.txt"
sort -k2 -n "$OUT/disk.txt" | tail -n 1 | sed 's/^/disk peak: /' | tee -a "$OUT/timeline.txt"
grep -F "| CACHED |" "$OUT/jit-steps.md" | grep -qF "humanize" \
    || { stamp "FAILED: the child's compile step was not CACHED"; exit 1; }
stamp "done: $OUT/steps.md (run $RUN_ID, workspace $WORK)"
