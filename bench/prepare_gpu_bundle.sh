#!/usr/bin/env bash
# Gather what bench/jit_gpu_check.py needs on the GPU machine (which reaches no index): the
# FlashInfer module precompiled into the ci-mini-sm90 image, and the wheels `import flashinfer`
# needs beside the torch already installed there. Output: build/gpu-bundle/ (under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/gpu-bundle
rm -rf "$out" && mkdir -p "$out/wheels"
image="$(.venv/bin/sm120-stacks build ci-mini-sm90 | awk '/^(up to date|built)/ {print $NF=="" ? $0 : $0}' | grep -o 'sm120-stacks:[^ ]*' | head -1)"
cid="$(docker create "$image")"
trap 'docker rm -f "$cid" >/dev/null' EXIT
docker cp "$cid:/opt/venv/lib/python3.11/site-packages/flashinfer/data/aot/norm/norm.so" "$out/norm.so"
for py in 311 312; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$py" \
    --platform manylinux_2_28_x86_64 -d "$out/wheels/cp$py" apache-tvm-ffi==0.1.9 numpy
done
python3 -m pip download --quiet --no-deps -d "$out/wheels/common" flashinfer-python==0.6.11.post2 \
  nvidia-ml-py tqdm requests urllib3 idna certifi packaging filelock einops tabulate click typing-extensions
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  -d "$out/wheels/common" ninja==1.13.2
cp bench/jit_gpu_check.py "$out/"
du -sh "$out"
