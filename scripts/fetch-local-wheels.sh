#!/usr/bin/env bash
# Fetch the wheel files test stacks install from this machine (python.wheels in ci-mini):
# a CPU-only torch, so tests need neither a GPU nor torch's 4 GB of CUDA wheels.
# pip finds it in the machine's wheel cache (find-links) or on its configured indexes.
set -euo pipefail
DEST="${WHEELS_DIR:-build/wheels}"
mkdir -p "$DEST"
want=("torch==2.13.0+cpu")
for spec in "${want[@]}"; do
  name="${spec%%==*}"; version="${spec#*==}"
  if compgen -G "$DEST/${name}-${version}-*.whl" >/dev/null; then continue; fi
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 -d "$DEST" "$spec"
done
ls -1 "$DEST"
