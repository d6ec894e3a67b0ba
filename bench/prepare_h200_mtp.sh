#!/usr/bin/env bash
# Gather what the MTP proof (issue 44) and the 0.33 egress proof (issue 33) need on the GPU
# machine, which reaches no index and takes at most 64 MiB per call, the session checkout's
# tracked tree (~12 MB) included. Output: $DEST/p1 ... $DEST/pN (an ignored folder of the
# checkout the device tool sends), one carried per call, sent back to back.
#
#   WORK=/work/gpuwork-i44 DEST=/work/main/.gpu-i44 bench/prepare_h200_mtp.sh
#
# As bench/prepare_h200_vllm033.sh (its site step: the lock's wheels for cp312 less what the
# machine has, fatbin-stripped to sm_90 machine code, FA2 keeping its hd64 bf16 PTX), except:
# - no built image: the FlashInfer module the 0.33 sm90 serve path loads (`sampling`, derived
#   by `sm120-stacks show vllm-0.33-sm90`) is compiled here for 9.0a with the site's
#   flashinfer-python and this machine's nvcc, under the serve spec's toolchain variables, into
#   the workspace layout the image has (fi.tar.xz: cached_ops/, an empty aot/);
# - the tool is the working tree (uncommitted work included), bench/ with it;
# - two models: tiny-llama (tests.support.tinymodel, the egress starts) and the random-weight
#   NVFP4 NemotronH with MTP (tests.support.tinymtp);
# - two serve specs: vllm-0.33-sm90 (serve-spec.json) and vllm-0.33-sm90-mtp (serve-spec-mtp.json).
# $WORK/sel must hold the wheels (bench/h200_wheels.sh over the vllm-0.33-sm90 lock, as there).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
work="${WORK:?WORK}"
dest="${DEST:?DEST}"
py312="${PY312:-python3.12}"
part_bytes="${PART_BYTES:-50000000}"
export PIP_CERT="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"

# 1. site.tar.xz (the vllm-0.33-sm90 lock's packages, as prepare_h200_vllm033.sh makes it)
if [[ ! -s "$work/site.tar.xz" ]]; then
  wheels=()
  while read -r req; do
    name="${req%%==*}"; ver="${req##*==}"
    norm="$(tr '[:upper:]-.' '[:lower:]__' <<<"$name")"
    w="$(ls "$work"/sel/*.whl | awk -v n="$norm" -v v="$ver" '{f=$0; sub(".*/","",f); split(f,a,"-"); g=tolower(a[1]); gsub(/[-.]/,"_",g); if (g==n && a[2]==v) print $0}' | head -1)"
    [[ -n "$w" ]] || { echo "no wheel for $req" >&2; exit 1; }
    wheels+=("$w")
  done <"$work/reqs.txt"
  rm -rf "$work/site"
  "$py312" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "${wheels[@]}"
  s="$work/site"
  rm -rf "$s/bin" "$s/vllm/vllm-rs" \
    "$s/triton/backends/nvidia/lib/cupti" "$s/triton/backends/nvidia/lib/cupti-blackwell" \
    "$s/triton/backends/nvidia/bin/ptxas-blackwell"
  find "$s" -name __pycache__ -prune -exec rm -rf {} +
  strip --strip-debug "$s/triton/_C/libtriton.so"
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

# 2. serve specs (the working tree's), fi.tar.xz (sampling for 9.0a, compiled here)
PYTHONPATH="$root" .venv/bin/python bench/serve_spec.py vllm-0.33-sm90 >"$work/serve-spec.json"
PYTHONPATH="$root" .venv/bin/python bench/serve_spec.py vllm-0.33-sm90-mtp >"$work/serve-spec-mtp.json"
if [[ ! -s "$work/fi.tar.xz" ]]; then
  ws="$work/fiws"
  rm -rf "$ws" && mkdir -p "$ws"
  # the spec's toolchain variables, so the build.ninja there is the one the machine's vLLM writes
  env_args=()
  while IFS= read -r kv; do env_args+=("$kv"); done < <(jq -r '.env | to_entries[] | "\(.key)=\(.value)"' "$work/serve-spec.json")
  ( time env "${env_args[@]}" FLASHINFER_WORKSPACE_BASE="$ws" MAX_JOBS=2 PYTHONPATH="$work/site" \
      FLASHINFER_JIT_VERBOSE=1 "$py312" -c 'from flashinfer.jit.sampling import gen_sampling_module as g; s = g(); s.build(); print(s.name)' ) \
      >"$work/fi-build.log" 2>&1
  ops="$(dirname "$(find "$ws" -name sampling.so | head -1)")/.."
  rm -rf "$work/fi" && mkdir -p "$work/fi/aot" && cp -r "$ops" "$work/fi/cached_ops"
  tar -C "$work/fi" -cJf "$work/fi.tar.xz" .
fi

# 3. models, tool
rm -rf "$work/model" && mkdir -p "$work/model"
PYTHONPATH="$root" .venv/bin/python -m tests.support.tinymodel --vllm "$work/model/tiny-llama"
PYTHONPATH="$root" .venv/bin/python -m tests.support.tinymtp "$work/model"
tar -C "$work/model" -cJf "$work/model.tar.xz" tiny-llama tiny-nemotronh-mtp-nvfp4
tar -C "$root" --exclude=__pycache__ -cJf "$work/tool.tar.xz" builder knowledge stacks templates patches bench/h200_serve.py bench/h200_mtp.py bench/h200_egress.sh bench/h200_vllm033.sh bench/serve_spec.py

# 4. the parts: site split; the small files ride in the last part
rm -rf "$dest" && mkdir -p "$dest"
rm -f "$work"/site.tar.xz.part*
split -b "$part_bytes" -d -a 2 "$work/site.tar.xz" "$work/site.tar.xz.part"
i=0
for p in "$work"/site.tar.xz.part*; do i=$((i + 1)); mkdir -p "$dest/p$i"; mv "$p" "$dest/p$i/"; done
smalls=("$work"/fi.tar.xz "$work"/model.tar.xz "$work"/tool.tar.xz "$work"/serve-spec.json
        "$work"/serve-spec-mtp.json "$work"/fa2-keep.txt)
if (( $(du -cb "$dest/p$i" "${smalls[@]}" | tail -1 | cut -f1) > part_bytes + 2000000 )); then
  i=$((i + 1)); mkdir -p "$dest/p$i"
fi
cp "${smalls[@]}" "$dest/p$i/"
du -sb "$dest"/* | tee "$work/parts.txt"
