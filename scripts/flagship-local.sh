#!/usr/bin/env bash
# Build and test a flagship stack on this machine, which reaches no image registry: the stack's
# nvidia/cuda base is substituted by local/cuda:13.0.2-devel-bookworm (`make base-cuda-local`).
# That base is Debian 12, whose Python is 3.11 (Ubuntu 24.04's 3.12 is not installable here),
# so a local variant overrides python.version and the apt package names and nothing else: the
# pins, arch flags, JIT modules and serve settings are the flagship's own. The variant is locked
# to prefer the flagship's committed lock (stacks/STACK.lock), so its image installs the locked
# set wherever Python 3.11 allows, hash-checked; `lock` lists the packages that had to move.
#
#   scripts/flagship-local.sh vllm-0.22-marlin     # hours the first time on 2 cores
#   scripts/flagship-local.sh --variant-only STACK DIR   # only write DIR/STACK-local.yaml
set -euo pipefail
write_variant() {  # STACK DIR: the local variant's manifest
    cat >"$2/$1-local.yaml" <<YAML
# $1 on the local Debian 12 CUDA base (scripts/flagship-local.sh).
extends: $1
python:
  version: "3.11"
build:
  apt_packages: [python3.11, python3.11-venv, python3.11-dev, ca-certificates]
  runtime_apt_packages: [python3.11, python3.11-venv, ca-certificates]
YAML
}
if [[ ${1:-} == --variant-only ]]; then
    write_variant "${2:?usage: scripts/flagship-local.sh --variant-only STACK DIR}" "${3:?DIR}"
    exit 0
fi
stack="${1:?usage: scripts/flagship-local.sh STACK}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
work="build/local-stacks"
mkdir -p "$work/stacks"
cp stacks/*.yaml "$work/stacks/"
ln -sfn "$root/patches" "$work/patches"
write_variant "$stack" "$work/stacks"
scripts/make-base-cuda-local.sh
export SM120_STACKS_BASE_SUBSTITUTE="nvidia/cuda:13.0.2-devel-ubuntu24.04=local/cuda:13.0.2-devel-bookworm"
cli=(.venv/bin/sm120-stacks --stacks-dir "$work/stacks" --build-dir build)
if [[ -f "stacks/$stack.lock" ]]; then  # before check: a lock of an older manifest is stale
  "${cli[@]}" lock "$stack-local" --versions-from "stacks/$stack.lock"
fi
"${cli[@]}" check "$stack-local"
"${cli[@]}" build "$stack-local"
"${cli[@]}" test "$stack-local"
