#!/usr/bin/env bash
# Gather what the vLLM 0.33 sm90 proof needs on the GPU machine (bench/h200_serve.py, RESULTS
# §10), which reaches no index and takes at most 64 MiB per run (the working tree included).
# Output: .gpu/p1 ... .gpu/pN (.gpu is in .git/info/exclude), carried by N runs back to back.
#
#   bench/prepare_h200_vllm033.sh STACK IMAGE [COMMIT]
#     STACK: vllm-0.33-sm90; IMAGE: its built image (the -local variant on this machine);
#     COMMIT: the commit whose tool (builder/, knowledge/, stacks/, templates/, patches/) runs
#     the smoke there (default HEAD; `git archive`, so uncommitted work stays here).
#
# What travels, and why (bench/RESULTS.md §10 has the measured sizes):
# - site.tar.xz: the packages of the stack's lock, as cp312 wheels installed with --target,
#   less what the GPU machine's own image holds at a version torch 2.14 accepts (its CUDA
#   libraries: cuBLAS, cuDNN 9.19, cuSPARSELt, ...: the lock's nvidia-* wheels stay here and
#   the machine's are used; torchaudio 2.11.0, the lock's version) and what the
#   serve path of a dense bf16 model on sm90 imports only behind a guard that tolerates its
#   absence (read in the image: nvidia-cutlass-dsl, humming-kernels, quack-kernels, tilelang,
#   tokenspeed-*, z3-solver, torchcodec, opencv, cudnn-frontend, nccl4py, nccl-extensions).
#   NCCL travels: the machine's 2.28.9 lacks ncclCommResume, which libtorch_cuda.so 2.14 binds
#   at load (RESULTS §10); cuDNN 9.19 loads (torch refuses only its use: 9.24 compiled in).
#   Every CUDA library keeps only sm_90 machine code (bench/fatbin_strip.py zero-fills the
#   rest in place; xz then takes the zeros to nothing). FA2's library (sm_80 machine code and
#   PTX only, what the driver JIT-compiles on sm_90) keeps the PTX of its head-dim-64 bf16
#   modules (found by reading its extracted PTX); libtriton.so loses its debug sections;
#   Triton's CUPTI copies (profiling only) and its Blackwell ptxas, vllm-rs (only with
#   VLLM_USE_RUST_FRONTEND) stay here.
# - fi.tar.xz: the FlashInfer modules the image precompiled, copied out of the image as it
#   holds them (cached_ops/<module>/ and the AOT copies).
# - model.tar.xz, tool.tar.xz (git archive COMMIT), serve-spec.json (bench/serve_spec.py of
#   that commit); fiattn.tar.xz where $WORK/fiattn exists (another stack's serve spec and
#   rendered tools/, for bench/h200_derived.py).
set -euo pipefail
stack="${1:?usage: bench/prepare_h200_vllm033.sh STACK IMAGE [COMMIT]}"
image="${2:?usage: bench/prepare_h200_vllm033.sh STACK IMAGE [COMMIT]}"
commit="$(git rev-parse "${3:-HEAD}")"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
work="${WORK:-/work/gpuwork-$stack}"
py312="${PY312:-python3.12}"
part_bytes="${PART_BYTES:-57000000}"   # 64 MiB less the working tree that travels with it
mkdir -p "$work/sel"
export PIP_CERT="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
snap="$work/tool-src"
rm -rf "$snap" && mkdir -p "$snap" && git archive "$commit" | tar -x -C "$snap"

# 1. site.tar.xz
if [[ ! -s "$work/site.tar.xz" ]]; then
  .venv/bin/python - "$snap/stacks/$stack.lock" "$work/reqs.txt" <<'PY'
import re, sys, yaml
lock = yaml.safe_load(open(sys.argv[1]))["python"]
skip = re.compile(r"^(nvidia-(?!nccl-cu13$).*|cuda-toolkit|tokenspeed-.*|tilelang|z3-solver|quack-kernels|"
                  r"humming-kernels|torchcodec|pynvvideocodec|opencv-python-headless|"
                  r"torchaudio|nccl4py|nccl-extensions)$")
pins = {**lock["heavy"], **lock["packages"]}
with open(sys.argv[2], "w") as out:
    for name, pin in sorted(pins.items()):
        if not skip.match(name):
            out.write(f"{name}=={pin['version']}\n")
PY
  . bench/h200_wheels.sh
  h200_wheels "$work/reqs.txt" "$work/sel"
  rm -rf "$work/site"
  # only the wheels of reqs.txt (sel/ may hold others from an earlier list)
  wheels=()
  while read -r req; do
    name="${req%%==*}"; ver="${req##*==}"
    norm="$(tr '[:upper:]-.' '[:lower:]__' <<<"$name")"
    w="$(ls "$work"/sel/*.whl | awk -v n="$norm" -v v="$ver" '{f=$0; sub(".*/","",f); split(f,a,"-"); g=tolower(a[1]); gsub(/[-.]/,"_",g); if (g==n && a[2]==v) print $0}' | head -1)"
    [[ -n "$w" ]] || { echo "no wheel for $req" >&2; exit 1; }
    wheels+=("$w")
  done <"$work/reqs.txt"
  "$py312" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "${wheels[@]}"
  s="$work/site"
  rm -rf "$s/bin" "$s/vllm/vllm-rs" \
    "$s/triton/backends/nvidia/lib/cupti" "$s/triton/backends/nvidia/lib/cupti-blackwell" \
    "$s/triton/backends/nvidia/bin/ptxas-blackwell"
  find "$s" -name __pycache__ -prune -exec rm -rf {} +
  strip --strip-debug "$s/triton/_C/libtriton.so"
  # FA2: the PTX modules of head dim 64 in bf16 (the tiny model), by their cuobjdump number
  rm -rf "$work/fa2ptx" && mkdir -p "$work/fa2ptx"
  (cd "$work/fa2ptx" && "$s/triton/backends/nvidia/bin/cuobjdump" -xptx all \
    "$s/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" >/dev/null)
  keep=""
  for f in "$work"/fa2ptx/*.ptx; do
    if grep -q "Flash_fwd_kernel_traitsILi64E" "$f" && grep -q "cutlass10bfloat16_t" "$f" \
       && ! grep -q "cutlass6half_t" "$f"; then
      n="${f%.sm_80.ptx}"; keep="$keep,${n##*.}"
    fi
  done
  keep="${keep#,}"
  echo "FA2 PTX kept (hd64 bf16): $keep" | tee "$work/fa2-keep.txt"
  rm -rf "$work/fa2ptx"
  python3 bench/fatbin_strip.py --ptx-index "$keep" "$s/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" \
    | tee "$work/strip.txt"
  find "$s" -name '*.so*' -type f ! -path '*/_vllm_fa2_C*' -print0 \
    | xargs -0 python3 bench/fatbin_strip.py --quiet | tee -a "$work/strip.txt"
  tar -C "$s" -cf - . | xz -T2 -6 >"$work/site.tar.xz"
fi

# 2. fi.tar.xz, out of the image as it holds them
spec="$(cd "$snap" && PYTHONPATH="$snap" "$root/.venv/bin/python" bench/serve_spec.py "$stack")"
echo "$spec" >"$work/serve-spec.json"
rm -rf "$work/fi" && mkdir -p "$work/fi"
cid="$(docker create "$image")"
trap 'docker rm -f "$cid" >/dev/null' EXIT
jit_dir="$(jq -r .jit_dir <<<"$spec")"
docker cp "$cid:$jit_dir" "$work/fi/cached_ops"
site_dir="$(docker run --rm --entrypoint python "$image" -c 'import flashinfer,os;print(os.path.dirname(flashinfer.__file__))')"
docker cp "$cid:$site_dir/data/aot" "$work/fi/aot"
tar -C "$work/fi" -cf - . | xz -T2 -6 >"$work/fi.tar.xz"

# 3. model, tool
rm -rf "$work/model" && (cd "$snap" && PYTHONPATH="$snap" "$root/.venv/bin/python" -m tests.support.tinymodel --vllm "$work/model/tiny-llama")
tar -C "$work/model" -cJf "$work/model.tar.xz" tiny-llama
tar -C "$snap" --exclude=__pycache__ -cJf "$work/tool.tar.xz" builder knowledge stacks templates patches
echo "$commit" >"$work/tool-commit.txt"

# 4. the parts: site split; the small files ride in the last part
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >>.git/info/exclude; }
rm -rf .gpu && mkdir -p .gpu
rm -f "$work"/site.tar.xz.part*
split -b "$part_bytes" -d -a 2 "$work/site.tar.xz" "$work/site.tar.xz.part"
i=0
for p in "$work"/site.tar.xz.part*; do i=$((i + 1)); mkdir -p ".gpu/p$i"; mv "$p" ".gpu/p$i/"; done
smalls=("$work"/fi.tar.xz "$work"/model.tar.xz "$work"/tool.tar.xz "$work"/serve-spec.json
        "$work"/tool-commit.txt "$work"/fa2-keep.txt)
# Another stack's derivation to precompile there (h200_derived.py; RESULTS §10, FlashInfer
# attention): $work/fiattn/ holds its serve-spec.json and rendered tools/, made beforehand.
if [[ -d "$work/fiattn" ]]; then
  tar -C "$work" -cJf "$work/fiattn.tar.xz" fiattn && smalls+=("$work/fiattn.tar.xz")
fi
if (( $(du -cb ".gpu/p$i" "${smalls[@]}" | tail -1 | cut -f1) > part_bytes + 4000000 )); then
  i=$((i + 1)); mkdir -p ".gpu/p$i"
fi
cp "${smalls[@]}" ".gpu/p$i/"
du -sb .gpu/* | tee "$work/parts.txt"
