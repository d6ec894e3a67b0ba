#!/usr/bin/env bash
# Rebuilds that compile only what changed (issue 37; bench/RESULTS.md, "Rebuild economy";
# `make bench-rebuild`), on ci-mini in a few minutes:
#
#  1. ci-mini-rebuild: ci-mini with one toolchain variable of this run's own, so its FlashInfer
#     compile inputs, and with them its compile step and cache mount, are new: the compile runs
#     cold (the pip layers may be cached from earlier builds: cold-ish);
#  2. ci-mini-rebuild-six: a child of it that adds `six`, a package FlashInfer does not import.
#     Its packages stage reinstalls; its compile step must be CACHED and compile no module.
#  3. (issue 46) ci-mini-rebuild-serve (another port: a serve-argument child) and
#     ci-mini-rebuild-transformers (transformers 5.23.0: a bump that keeps torch and FlashInfer),
#     then a no-op of the parent; steps.md: steps CACHED/run, nvcc lines and what uv installed
#     per build; noop-pairs.txt: 5 no-ops of the tool against BuildKit's no-op of the same context.
#
# Each build's BuildKit log (build/NAME/logs/) is copied beside the table of their JIT steps.
# Nothing is pruned or removed; the two images keep their tags in the scratch workspace's names.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${WORK:-$(mktemp -d /tmp/sm120-rebuild-bench.XXXXXX)}
OUT=${OUT:-$PWD/bench/results/rebuild-economy}
CLI=$PWD/.venv/bin/sm120-stacks
export PYTHONPATH=$PWD  # this checkout's builder, whichever checkout the venv was made in
PY=$PWD/.venv/bin/python
RUN_ID=${RUN_ID:-$(date -u +%Y%m%dT%H%M%S)-$$}
mkdir -p "$OUT"
rm -f "$OUT"/{build-parent,build-child,build-serve,build-transformers,build-noop,timeline,noop-pairs}.txt \
    "$OUT"/{parent,child-six,child-serve,child-transformers}.buildkit.log "$OUT"/{jit-steps,steps}.md
SECONDS=0

. bench/workspace.sh
bench_workspace "$WORK" ci-mini-rebuild \
    "$(printf 'extends: ci-mini\nbuild:\n  toolchain_env:\n    SM120_REBUILD_BENCH_RUN: "%s"\n' "$RUN_ID")"
printf 'extends: ci-mini-rebuild\npython:\n  packages:\n    six: 1.17.0\n' \
    >"$WORK/stacks/ci-mini-rebuild-six.yaml"

build_log() {  # the log of NAME's current image, as the tool names it
    (cd "$WORK" && "$PY" - "$1" <<'PY'
import sys
from pathlib import Path
from builder.image.names import content_tag
from builder.render.context import render
from builder.manifest.resolve import resolve
name = sys.argv[1]
content_hash = render(resolve(name, Path("stacks"))).content_hash()
print(Path("build") / name / "logs" / f"{content_tag(name, content_hash)}.log")
PY
    )
}

printf 'extends: ci-mini-rebuild\nserve:\n  port: 8001\n' >"$WORK/stacks/ci-mini-rebuild-serve.yaml"
# The nearest stand-in for a vLLM bump that keeps torch and FlashInfer: another transformers.
printf 'extends: ci-mini-rebuild\npython:\n  packages:\n    transformers: {version: 5.23.0, extras: [serving]}\n' \
    >"$WORK/stacks/ci-mini-rebuild-transformers.yaml"

must build-parent "$CLI" build ci-mini-rebuild
must build-child "$CLI" build ci-mini-rebuild-six
must build-serve "$CLI" build ci-mini-rebuild-serve
must build-transformers "$CLI" build ci-mini-rebuild-transformers
must build-noop "$CLI" build ci-mini-rebuild
cp "$WORK/$(build_log ci-mini-rebuild)" "$OUT/parent.buildkit.log"
cp "$WORK/$(build_log ci-mini-rebuild-six)" "$OUT/child-six.buildkit.log"
cp "$WORK/$(build_log ci-mini-rebuild-serve)" "$OUT/child-serve.buildkit.log"
cp "$WORK/$(build_log ci-mini-rebuild-transformers)" "$OUT/child-transformers.buildkit.log"
# Issue 46: each build's wall time (timeline.txt), steps CACHED or run, nvcc lines and what uv
# downloaded and installed, side by side; then the no-op against BuildKit's own no-op of the
# same context (the replay script the build wrote), 5 pairs.
"$PY" bench/rebuild_economy.py --steps \
    "cold=$OUT/parent.buildkit.log" "one-package child=$OUT/child-six.buildkit.log" \
    "serve-argument child=$OUT/child-serve.buildkit.log" \
    "transformers bump=$OUT/child-transformers.buildkit.log" | tee "$OUT/steps.md"
command_sh="$WORK/$(build_log ci-mini-rebuild)"
command_sh="${command_sh%.log}.command.sh"
noop_pairs ci-mini-rebuild "$command_sh"
"$PY" bench/rebuild_economy.py \
    "ci-mini-rebuild (new compile inputs)=$OUT/parent.buildkit.log" \
    "ci-mini-rebuild-six (one unrelated package)=$OUT/child-six.buildkit.log" \
    | tee "$OUT/jit-steps.md"
grep -F "| CACHED |" "$OUT/jit-steps.md" | grep -qF "six" \
    || { stamp "FAILED: the child's compile step was not CACHED"; exit 1; }
stamp "done: $OUT/jit-steps.md (run $RUN_ID, workspace $WORK)"
