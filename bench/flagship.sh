#!/usr/bin/env bash
# The flagship measurements of bench/RESULTS.md §4, for a stack scripts/flagship-local.sh built:
# its cold build by stage (from the build's own log), its image by layer against a single-stage
# build, and rebuilds (no-op, serve-argument change) paired against plain BuildKit. Runs from the
# build cache the flagship build left: minutes, not hours.
#
#   bench/flagship.sh vllm-0.22-b12x          # or: make bench-flagship STACK=vllm-0.22-b12x
set -euo pipefail
stack="${1:?usage: bench/flagship.sh STACK}-local"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py=.venv/bin/python
export SM120_STACKS_BASE_SUBSTITUTE="nvidia/cuda:13.0.2-devel-ubuntu24.04=local/cuda:13.0.2-devel-bookworm"
log="$(ls -t "build/$stack/logs/"*.log | head -n 1)"
echo "## $stack: cold build by stage ($log)"
"$py" bench/stage_times.py "$log"
"$py" bench/layer_sizes.py "$stack"
"$py" bench/build_bench.py --stacks-dir build/local-stacks/stacks --stack "$stack" --cold-pairs 0
