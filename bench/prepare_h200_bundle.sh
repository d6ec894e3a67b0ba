#!/usr/bin/env bash
# Gather what the vLLM sm90 proof needs on the GPU machine (bench/h200_serve.py, RESULTS §5),
# which reaches no index and takes at most 64 MiB of files per run. Output: .gpu/a .gpu/b
# .gpu/c (each under 61 MB; .gpu is in .git/info/exclude), carried by three runs back to back.
#
#   bench/prepare_h200_bundle.sh IMAGE    # IMAGE: the built vllm-0.22-sm90(-local) image
#
# What travels, and why:
# - site.tar.xz: the packages of the stack's lock that the GPU machine lacks (it has Python
#   3.12, torch 2.11.0+cu130, triton 3.6.0, transformers 5.17 and the CUDA wheels already:
#   the kind's package list in the device docs), as cp312 wheels installed with --target.
#   Left out: what a dense bf16 model never imports there (checked by importing the serve
#   path in the image: bench/RESULTS.md §5): tokenspeed-*, tilelang, z3-solver,
#   nvidia-cutlass-dsl*, quack-kernels, humming-kernels, flashinfer-cubin, the CUDA compiler
#   wheels (the machine has CUDA 13.0); and from vllm, FA2's library (sm_80 only), vllm-rs,
#   _moe_C, _flashmla_C, deep_gemm builds for other Pythons, libxgrammar.a.
# - fi.tar.xz: the FlashInfer modules the image precompiled, copied out of the image as it
#   holds them: cached_ops/<module>/ from FlashInfer's workspace and the AOT .so copies.
# - model.tar.xz: the tiny Llama (head dim 64, bf16) made by tests/support/tinymodel.py.
# - tool.tar.xz: this tree's builder/, knowledge/, stacks/, templates/, patches/ (the smoke
#   runs from it there), serve-spec.json (bench/serve_spec.py), tri-aot.tar.xz (Triton kernels
#   compiled here for sm_90 by bench/triton_aot_check.py).
set -euo pipefail
image="${1:?usage: bench/prepare_h200_bundle.sh IMAGE}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
work="${WORK:-/work/gpuwork}"
py312="${PY312:-python3.12}"
stack=vllm-0.22-sm90
mkdir -p "$work/wheels" "$work/sel"
export PIP_CERT="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"

# 1. site.tar.xz
if [[ ! -s "$work/site.tar.xz" ]]; then
  .venv/bin/python - "$work/reqs.txt" <<'PY'
import re, sys, yaml
lock = yaml.safe_load(open("stacks/vllm-0.22-sm90.lock"))["python"]
kinds = open("/work/.library/device/KINDS.md").read()
there = {n.strip().lower() for n in kinds.split("Packages: ")[1].split(".\n")[0].split(",")}
skip = re.compile(r"^(tokenspeed-.*|tilelang|z3-solver|nvidia-cutlass-dsl.*|quack-kernels|"
                  r"humming-kernels|flashinfer-cubin|nvidia-cuda-nvcc|nvidia-nvvm|"
                  r"nvidia-cuda-crt|nvidia-cuda-cccl)$")
pins = {**lock["heavy"], **lock["packages"]}
with open(sys.argv[1], "w") as out:
    for name, pin in sorted(pins.items()):
        if name.lower() not in there and not skip.match(name):
            out.write(f"{name}=={pin['version']}\n")
PY
  . bench/h200_wheels.sh
  h200_wheels "$work/reqs.txt" "$work/sel"
  rm -rf "$work/site"
  "$py312" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$work"/sel/*.whl
  (cd "$work/site" && rm -rf bin vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs \
    vllm/_moe_C.abi3.so vllm/_flashmla_C.abi3.so xgrammar/lib/libxgrammar.a \
    vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so \
    && find . -name __pycache__ -prune -exec rm -rf {} +)
  tar -C "$work/site" -cf - . | xz -T2 -6 >"$work/site.tar.xz"
fi

# 2. fi.tar.xz, out of the image as it holds them
rm -rf "$work/fi" && mkdir -p "$work/fi"
cid="$(docker create "$image")"
trap 'docker rm -f "$cid" >/dev/null' EXIT
spec="$(.venv/bin/python bench/serve_spec.py "$stack")"
jit_dir="$(jq -r .jit_dir <<<"$spec")"
docker cp "$cid:$jit_dir" "$work/fi/cached_ops"
site_dir="$(docker run --rm --entrypoint python "$image" -c 'import flashinfer,os;print(os.path.dirname(flashinfer.__file__))')"
docker cp "$cid:$site_dir/data/aot" "$work/fi/aot"
tar -C "$work/fi" -cf - . | xz -T2 -6 >"$work/fi.tar.xz"

# 3. model, 4. tool, spec, Triton kernels
rm -rf "$work/model" && .venv/bin/python -m tests.support.tinymodel --vllm "$work/model/tiny-llama"
tar -C "$work/model" -cJf "$work/model.tar.xz" tiny-llama
tar --exclude=__pycache__ -cJf "$work/tool.tar.xz" builder knowledge stacks templates patches
rm -rf "$work/tri-aot"
PYTHONPATH="${TRITON_SITE:-}" "$py312" bench/triton_aot_check.py compile "$work/tri-aot" 90 120
tar -C "$work" -cJf "$work/tri-aot.tar.xz" tri-aot

# 5. the three parts
rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/c
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
split -b 60000000 -d -a 2 "$work/site.tar.xz" "$work/site.tar.xz.part"
mv "$work/site.tar.xz.part00" .gpu/a/
mv "$work/site.tar.xz.part01" .gpu/b/
mv "$work"/site.tar.xz.part* .gpu/c/
cp "$work"/fi.tar.xz "$work"/model.tar.xz "$work"/tool.tar.xz "$work"/tri-aot.tar.xz .gpu/c/
.venv/bin/python bench/serve_spec.py "$stack" >.gpu/c/serve-spec.json
du -sh .gpu/*
