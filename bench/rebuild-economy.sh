#!/usr/bin/env bash
# Rebuilds that compile only what changed (issue 37; bench/RESULTS.md, "Rebuild economy";
# `make bench-rebuild`), on ci-mini in a few minutes:
#
#  1. ci-mini-rebuild: ci-mini with one toolchain variable of this run's own, so its FlashInfer
#     compile inputs, and with them its compile step and cache mount, are new: the compile runs
#     cold (the pip layers may be cached from earlier builds: cold-ish);
#  2. ci-mini-rebuild-six: a child of it that adds `six`, a package FlashInfer does not import.
#     Its packages stage reinstalls; its compile step must be CACHED and compile no module.
#
# Each build's BuildKit log (build/NAME/logs/) is copied beside the table of their JIT steps.
# Nothing is pruned or removed; the two images keep their tags in the scratch workspace's names.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${WORK:-$(mktemp -d /tmp/sm120-rebuild-bench.XXXXXX)}
OUT=${OUT:-$PWD/bench/results/rebuild-economy}
CLI=$PWD/.venv/bin/sm120-stacks
PY=$PWD/.venv/bin/python
RUN_ID=${RUN_ID:-$(date -u +%Y%m%dT%H%M%S)-$$}
mkdir -p "$OUT"
rm -f "$OUT"/{build-parent,build-child,timeline}.txt "$OUT"/{parent,child-six}.buildkit.log "$OUT"/jit-steps.md
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

must build-parent "$CLI" build ci-mini-rebuild
must build-child "$CLI" build ci-mini-rebuild-six
cp "$WORK/$(build_log ci-mini-rebuild)" "$OUT/parent.buildkit.log"
cp "$WORK/$(build_log ci-mini-rebuild-six)" "$OUT/child-six.buildkit.log"
"$PY" bench/rebuild_economy.py \
    "ci-mini-rebuild (new compile inputs)=$OUT/parent.buildkit.log" \
    "ci-mini-rebuild-six (one unrelated package)=$OUT/child-six.buildkit.log" \
    | tee "$OUT/jit-steps.md"
grep -F "| CACHED |" "$OUT/jit-steps.md" | grep -qF "six" \
    || { stamp "FAILED: the child's compile step was not CACHED"; exit 1; }
stamp "done: $OUT/jit-steps.md (run $RUN_ID, workspace $WORK)"
