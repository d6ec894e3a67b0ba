#!/usr/bin/env bash
# Gather what the MTP proof (issue 44) and the 0.33 egress proof (issue 33) need on the GPU
# machine, which reaches no index and takes at most 64 MiB per call, the session checkout's
# tracked tree (~12.9 MB) included. Output: $DEST/p1 ... $DEST/pN (an ignored folder of the
# checkout the device tool sends, e.g. /work/main/.gpu listed in .git/info/exclude), one carried
# per call, sent back to back (the machine keeps /tmp only while warm, 30 s after a call).
#
#   WORK=/work/gpuwork-i44 DEST=/work/main/.gpu bench/prepare_h200_mtp.sh
#
# As bench/prepare_h200_vllm033.sh (its site step: the lock's wheels for cp312 less what the
# machine has, fatbin-stripped to sm_90 machine code, FA2 keeping its hd64 bf16 PTX), except:
# - zstd, not xz: `zstd -T2 -12 --long=27` of the 3.68 GB tree took 4.5 min on this 2-core
#   builder under load (561 MB, 11 parts of 52 MB); xz -6 ran at 1.3 MB/s here (about 35 min;
#   a 60 MB sample: xz -6 19.4 %, xz -3 21.2 %, zstd -12 23.1 % of input). The GPU machine has
#   no zstd (its first call: `which zstd`), so this builder's /usr/bin/zstd (static libzstd)
#   and its liblz4.so.1 ride in the last part; `h200_mtp.py unpack` uses them.
# - no FlashInfer module is built here: torch 2.14 in the site cannot be imported on this
#   builder (its CUDA library wheels stay behind) and this CUDA has no curand.h, which
#   `sampling` includes. `h200_mtp.py fi-build` compiles it on the machine before any start
#   (95.8 s at MAX_JOBS=16, bench/results/h200-mtp/unpack.txt), as the image build would.
# - the tool is the working tree, which every call sends anyway: no snapshot travels;
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
part_bytes="${PART_BYTES:-52000000}"   # + the 12.9 MB tree: under 64 MiB
export PIP_CERT="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"

# 1. site.tar.zst (the vllm-0.33-sm90 lock's packages, as prepare_h200_vllm033.sh makes them)
if [[ ! -s "$work/site.tar.zst" ]]; then
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
  tar -C "$s" -cf - . | zstd -q -T2 -12 --long=27 -o "$work/site.tar.zst"
fi

# 2. serve specs (the working tree's)
PYTHONPATH="$root" .venv/bin/python bench/serve_spec.py vllm-0.33-sm90 >"$work/serve-spec.json"
PYTHONPATH="$root" .venv/bin/python bench/serve_spec.py vllm-0.33-sm90-mtp >"$work/serve-spec-mtp.json"

# 3. models
rm -rf "$work/model" && mkdir -p "$work/model"
PYTHONPATH="$root" .venv/bin/python -m tests.support.tinymodel --vllm "$work/model/tiny-llama"
PYTHONPATH="$root" .venv/bin/python -m tests.support.tinymtp "$work/model"
tar -C "$work/model" -cJf "$work/model.tar.xz" tiny-llama tiny-nemotronh-mtp-nvfp4

# 4. the parts: site split; the small files and the zstd binary ride in the last part
rm -rf "$dest" && mkdir -p "$dest"
rm -f "$work"/site.tar.zst.part*
split -b "$part_bytes" -d -a 2 "$work/site.tar.zst" "$work/site.tar.zst.part"
i=0
for p in "$work"/site.tar.zst.part*; do i=$((i + 1)); mkdir -p "$dest/p$i"; mv "$p" "$dest/p$i/"; done
smalls=("$work"/model.tar.xz "$work"/serve-spec.json "$work"/serve-spec-mtp.json
        "$(command -v zstd)" "$(ldd "$(command -v zstd)" | awk '/liblz4/ {print $3}')")
if (( $(du -cb "$dest/p$i" "${smalls[@]}" | tail -1 | cut -f1) > part_bytes + 2000000 )); then
  i=$((i + 1)); mkdir -p "$dest/p$i"
fi
cp "${smalls[@]}" "$dest/p$i/"
du -sb "$dest"/* | sort -V | tee "$work/parts.txt"
