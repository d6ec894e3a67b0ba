#!/usr/bin/env bash
# The vLLM 0.33 sm90 proof on the GPU machine, one step per call (bench/RESULTS.md §10). The
# parts made by bench/prepare_h200_vllm033.sh arrive in runs sent back to back; the machine
# keeps /tmp only while it stays warm (30 s after a call).
#
#   bench/h200_vllm033.sh recv .gpu/pN            # copy a part into $H200_ROOT/parts
#   bench/h200_vllm033.sh probe                   # what the machine has; the fatbin-strip check
#   bench/h200_vllm033.sh unpack                  # h200_serve.py unpack, then torchcheck
#   bench/h200_vllm033.sh torchcheck              # torch 2.14 on the machine's cuDNN/NCCL
#   bench/h200_vllm033.sh collect NAME            # results -> $OUT/NAME.tar.xz (+ summary.jsonl)
#
# Serving itself is bench/h200_serve.py serve NAME [options] (H200_ROOT=/tmp/v033).
set -uo pipefail
export H200_ROOT="${H200_ROOT:-/tmp/v033}"
R="$H200_ROOT"
mkdir -p "$R/parts" "$R/results"
here="$(cd "$(dirname "$0")" && pwd)"
step="${1:?step}"
shift
case "$step" in
  recv)
    for d in "$@"; do cp "$d"/* "$R/parts/"; done
    ls -la "$R/parts" | tail -n +2
    ;;
  probe)
    {
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      python3 -c 'import sys; print(sys.version)'
      python3 -m pip show torch triton nvidia-cudnn-cu13 nvidia-nccl-cu13 nvidia-cusparselt-cu13 \
        nvidia-cublas nvidia-nvshmem-cu13 torchaudio opencv-python-headless 2>/dev/null \
        | grep -E '^(Name|Version|Location)'
      ls -la /usr/local/cuda/bin/ptxas /usr/local/cuda/bin/nvcc 2>&1
      python3 -c 'import sysconfig,os; p=os.path.join(sysconfig.get_paths()["purelib"],"nvidia"); print(p, sorted(os.listdir(p)))'
      nproc; free -g | head -2; df -h /tmp | tail -1
    } 2>&1 | tee "$R/results/probe.txt"
    # The fatbin strip on the machine's own torch: zero-filled entries must not stop the driver.
    site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    rm -rf /tmp/t211 && mkdir -p /tmp/t211 && cp -r "$site/torch" /tmp/t211/
    python3 "$here/fatbin_strip.py" --report /tmp/t211/torch/lib/libtorch_cuda.so 2>&1 | tee -a "$R/results/probe.txt"
    PYTHONPATH=/tmp/t211 python3 - <<'PY' 2>&1 | tee -a "$R/results/probe.txt"
import torch
print("torch", torch.__version__, torch.__file__)
x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
y = torch.nn.functional.softmax(x.float(), dim=1).sum().item()
z = (x @ x).float().abs().mean().item()
torch.cuda.synchronize()
print("stripped torch 2.11 on the H200: softmax sum", round(y, 1), "matmul mean", round(z, 2), "OK")
PY
    rm -rf /tmp/t211
    ;;
  unpack)
    python3 "$here/h200_serve.py" unpack "$R/parts" && rm -rf "$R/parts" && "$0" torchcheck
    ;;
  torchcheck)
    PYTHONPATH="$R/site" python3 - <<'PY' 2>&1 | tee "$R/results/torchcheck.txt"
import os, tempfile, time, torch
print("torch", torch.__version__, torch.version.cuda, torch.__file__)
print("cuda ok", torch.cuda.is_available(), torch.cuda.get_device_name(0))
x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
print("matmul", (x @ x).float().abs().mean().item())
try:
    print("cudnn", torch.backends.cudnn.version(), torch.backends.cudnn.is_available())
    c = torch.nn.functional.conv2d(torch.randn(1, 3, 32, 32, device="cuda"), torch.randn(8, 3, 3, 3, device="cuda"))
    print("cudnn conv ok", tuple(c.shape))
except Exception as e:
    print("cudnn FAILED:", type(e).__name__, e)
try:
    import torch.distributed as dist
    print("nccl version", torch.cuda.nccl.version())
    dist.init_process_group("nccl", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print("nccl all_reduce ok", t.tolist())
    dist.destroy_process_group()
except Exception as e:
    print("nccl FAILED:", type(e).__name__, e)
import triton, triton.language as tl
@triton.jit
def k(X, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(X + i, tl.load(X + i) * 2)
t = torch.ones(16, device="cuda")
k[(1,)](t, 16)
print("triton", triton.__version__, "kernel ok", t[0].item())
PY
    ;;
  collect)
    name="${1:?name}"
    tar -C "$R/results" -cJf "$OUT/$name.tar.xz" .
    cp "$R/results/summary.jsonl" "$OUT/" 2>/dev/null || true
    ls -la "$OUT"
    ;;
  *)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
