#!/usr/bin/env bash
# The CPU test stack for linux/arm64, built and tested on this amd64 machine under emulation:
# Debian's qemu-user-static runs every aarch64 binary of the build (RUN steps, nvcc, pip, the
# smoke server) through the kernel's binfmt_misc. What `make arm64-emulated` runs; idempotent.
#
#   1. qemu-user-static and binfmt-support (apt) when missing; binfmt_misc mounted; the
#      qemu-aarch64 handler registered with the F flag (the interpreter opened at registration,
#      so containers, which hold no qemu binary, can use it). What refuses is printed; exit 3.
#   2. The arm64 bases: local/debian-python:bookworm-arm64 (scripts/make-base-local.sh --arch
#      arm64) and local/cuda:13.0.2-devel-bookworm-arm64 (bases/cuda-13.0-devel FROM it, with
#      --platform linux/arm64; see below for its cuobjdump); each checked to be arm64.
#   3. `sm120-stacks build ci-mini-arm64`, then `sm120-stacks test ci-mini-arm64` with the tiny
#      model, then the architecture checks the test tool does not make (config, uname -m,
#      the ELF machine of python and of the precompiled FlashInfer module).
#
# MEASURE=1 (what bench/RESULTS.md "arm64 under emulation" reports): step 3 becomes two cold
# builds back to back, ci-mini for amd64 then ci-mini-arm64, both --no-cache, then both tests,
# each timed. The amd64 reference is ci-mini under the name ci-mini-amd64 (a stack that only
# extends it, in build/arm64-emulated/stacks/), so the tags of ci-mini's own images stay put.
# Timings: build/arm64-emulated/timings.tsv; the machine's state: build/arm64-emulated/machine.txt.
#
# Environment: MEASURE (0), ARM64_STACK (ci-mini-arm64), REF_STACK (ci-mini).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

STACK="${ARM64_STACK:-ci-mini-arm64}"
REF_STACK="${REF_STACK:-ci-mini}"
MEASURE="${MEASURE:-0}"
DEBIAN_BASE=local/debian-python:bookworm-arm64
CUDA_BASE=local/cuda:13.0.2-devel-bookworm-arm64
BINFMT=/proc/sys/fs/binfmt_misc
HANDLER="$BINFMT/qemu-aarch64"
OUT=build/arm64-emulated
CLI=.venv/bin/sm120-stacks
MOUNT=(--volume "$root/build/tiny-model:/models/tiny:ro")

say() { echo "arm64-emulated: $*" >&2; }
stop() { say "STOPPED: $*"; exit 3; }
mkdir -p "$OUT"

# --- 1. the emulator and its binfmt_misc handler ---------------------------------------------
if [[ "$(uname -m)" == aarch64 ]]; then
  say "this machine is aarch64: nothing to emulate (make stack STACK=$STACK)"
elif ! dpkg -s qemu-user-static binfmt-support >/dev/null 2>&1; then
  ((EUID == 0)) || stop "installing qemu-user-static binfmt-support needs root"
  say "installing qemu-user-static binfmt-support (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q qemu-user-static binfmt-support >/dev/null
fi
if [[ "$(uname -m)" != aarch64 ]]; then
  if [[ ! -e "$BINFMT/register" ]]; then
    grep -qw binfmt_misc /proc/filesystems ||
      stop "this kernel has no binfmt_misc (not in /proc/filesystems): aarch64 binaries cannot be handed to qemu"
    err="$(mount -t binfmt_misc binfmt_misc "$BINFMT" 2>&1)" ||
      stop "mount -t binfmt_misc binfmt_misc $BINFMT: $err"
    say "mounted binfmt_misc on $BINFMT"
  fi
  if ! grep -qx enabled "$HANDLER" 2>/dev/null || ! grep -q '^flags:.*F' "$HANDLER"; then
    # Registered without F (by hand, or an older package): unregister, register as packaged.
    [[ -e "$HANDLER" ]] && { echo -1 >"$HANDLER" || stop "could not unregister $HANDLER"; }
    err="$(update-binfmts --enable qemu-aarch64 2>&1)" || stop "update-binfmts --enable qemu-aarch64: $err"
    grep -qx enabled "$HANDLER" 2>/dev/null || stop "qemu-aarch64 is not enabled after update-binfmts: $(cat "$HANDLER" 2>&1)"
    grep -q '^flags:.*F' "$HANDLER" || stop "qemu-aarch64 is registered without the F flag: $(grep flags "$HANDLER")"
    say "registered qemu-aarch64 ($(grep '^flags' "$HANDLER"))"
  fi
fi

# --- 2. the bases (the amd64 ones too when measuring), the tiny model -----------------------
make --no-print-directory venv build/tiny-model >/dev/null
scripts/host-setup.sh
scripts/make-base-local.sh --arch arm64
# The CUDA base: bases/cuda-13.0-devel built FROM the arm64 Debian base for linux/arm64, as
# scripts/make-base-cuda-local.sh builds it for amd64 (same client choice, CA secret, network).
# That Dockerfile pins nvidia-cuda-cuobjdump 13.5.37, whose aarch64 binary needs glibc 2.38
# although the wheel is tagged manylinux_2_17 (Debian 12 has 2.36): its own check stops with
# "cuobjdump: /lib/aarch64-linux-gnu/libc.so.6: version `GLIBC_2.38' not found". While it does,
# the arm64 base is built from a copy pinning 13.4.92 (aarch64 binary: glibc 2.17), both hashes.
cuda_context=bases/cuda-13.0-devel
if grep -q '^ARG CUOBJDUMP_VERSION=13.5.37$' "$cuda_context/Dockerfile"; then
  mkdir -p "$OUT/cuda-base"
  sed -e 's/^ARG CUOBJDUMP_VERSION=13.5.37$/ARG CUOBJDUMP_VERSION=13.4.92/' \
    -e 's/sha256:38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58/sha256:fb72ca80d0cdd8f5e8e232ce17d3c5aa2a37c3153bb8ef4e010010ed4fdef6c5/' \
    -e 's/sha256:f48e3148535365161a268547b285fd01d92c80e4b457275375933825b5fc26b2/sha256:ed9ffbe59069e7ff94631ab4e279e5af7ee88ddafdf4c23f4a94d187f1470f03/' \
    -e 's/(13\.5 tool, listing cubins only)/(13.4 tool, listing cubins only)/' \
    "$cuda_context/Dockerfile" >"$OUT/cuda-base/Dockerfile"
  for want in CUOBJDUMP_VERSION=13.4.92 sha256:fb72ca80 sha256:ed9ffbe5; do
    grep -q "$want" "$OUT/cuda-base/Dockerfile" ||
      { say "could not re-pin cuobjdump in a copy of $cuda_context/Dockerfile ($want)"; exit 1; }
  done
  cuda_context="$OUT/cuda-base"
fi
if [[ "$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$CUDA_BASE" 2>/dev/null)" != linux/arm64 ]]; then
  # shellcheck source=scripts/buildkit-client.sh
  DOCKER=docker . "$root/scripts/buildkit-client.sh"   # sets build=(...)
  ca_bundle="$(.venv/bin/python -m builder.image.cabundle "${CA_BUNDLE:-${SM120_STACKS_CA_BUNDLE:-}}")"
  start=$SECONDS
  "${build[@]}" --platform linux/arm64 --network host --progress=plain \
    --build-arg "BASE_IMAGE=$DEBIAN_BASE" ${ca_bundle:+--secret "id=proxy-ca,src=$ca_bundle"} \
    -t "$CUDA_BASE" -f "$cuda_context/Dockerfile" "$cuda_context" >"$OUT/cuda-base.log" 2>&1 ||
    { tail -n 30 "$OUT/cuda-base.log" >&2; say "building $CUDA_BASE failed (log: $OUT/cuda-base.log)"; exit 1; }
  docker run --rm --network none --platform linux/arm64 "$CUDA_BASE" nvcc --version | grep 'release 13.0, V13.0.88'
  say "built $CUDA_BASE in $((SECONDS - start)) s (log: $OUT/cuda-base.log)"
fi
for image in "$DEBIAN_BASE" "$CUDA_BASE"; do
  got="$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$image")"
  [[ "$got" == linux/arm64 ]] || { say "$image is $got, not linux/arm64"; exit 1; }
done
if [[ "$MEASURE" == 1 ]]; then
  scripts/make-base-cuda-local.sh
  scripts/fetch-local-wheels.sh >/dev/null
fi

# --- 3. build and test -----------------------------------------------------------------------
timings="$OUT/timings.tsv"
[[ -f "$timings" ]] || printf 'when\tstep\tseconds\texit\n' >"$timings"
# timed STEP CMD...: run CMD, append its wall time to timings.tsv, keep its status.
timed() {
  local step=$1 start end rc=0
  shift
  start=$(date +%s.%N)
  "$@" || rc=$?
  end=$(date +%s.%N)
  printf '%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$step" "$(awk "BEGIN {printf \"%.1f\", $end - $start}")" "$rc" >>"$timings"
  return "$rc"
}

if [[ "$MEASURE" == 1 ]]; then
  # The machine as the builds found it: other builds on this engine share its two cores.
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "kernel: $(uname -r) $(uname -m); cores: $(nproc); memory: $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
    echo "engine: $(docker version --format '{{.Server.Version}}'), client: $(/usr/bin/docker version --format '{{.Client.Version}}' 2>/dev/null)"
    echo "qemu: $(qemu-aarch64-static --version | head -1)"
    echo "binfmt: $(tr '\n' ' ' <"$HANDLER")"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "disk: $(df -h /var/lib/docker | awk 'NR==2 {print $4 " free of " $2}')"
    echo "other builds running: $(pgrep -fa 'docker build|buildx build' | grep -c -v "$STACK" || true)"
  } >"$OUT/machine.txt"
  ref="${REF_STACK}-amd64"
  mkdir -p "$OUT/stacks" "$OUT/build"
  cp "stacks/$REF_STACK.yaml" "$OUT/stacks/"
  ln -sfn "$root/build/wheels" "$OUT/build/wheels"  # python.wheels are relative to the repo root
  printf '%s\n' "# $REF_STACK under a name of its own (scripts/arm64-emulated.sh): timed cold" \
    "# against $STACK without moving the tags of $REF_STACK's images." "extends: $REF_STACK" \
    >"$OUT/stacks/$ref.yaml"
  refcli=("$CLI" --stacks-dir "$OUT/stacks" --build-dir build)
  timed "build $ref (amd64, --no-cache)" "${refcli[@]}" build "$ref" --no-cache
  timed "build $STACK (arm64 emulated, --no-cache)" "$CLI" build "$STACK" --no-cache
  echo "load after builds: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"
  timed "test $ref (amd64)" "${refcli[@]}" test "$ref" "${MOUNT[@]}" || true
  timed "test $STACK (arm64 emulated)" "$CLI" test "$STACK" "${MOUNT[@]}"
else
  timed "build $STACK (arm64 emulated)" "$CLI" build "$STACK"
  timed "test $STACK (arm64 emulated)" "$CLI" test "$STACK" "${MOUNT[@]}"
fi

# --- 4. the architecture, which `sm120-stacks test` does not check -------------------------
image="sm120-stacks:$STACK"
config="$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$image")"
read -r machine python_elf module_elf < <(docker run --rm --network none --platform linux/arm64 \
  --entrypoint /bin/sh "$image" -c '
    elf() { od -An -tu2 -j18 -N2 "$1" | tr -d " "; }   # e_machine: 62 x86-64, 183 AArch64
    so=$(find /opt/flashinfer-cache -name "*.so" | head -1)
    echo "$(uname -m) $(elf "$(readlink -f "$(command -v python)")") $(elf "$so")"')
echo "$image: config $config, uname -m $machine, ELF e_machine of python $python_elf, of the FlashInfer module $module_elf (183 = AArch64)" |
  tee "$OUT/architecture.txt"
[[ "$config" == linux/arm64 && "$machine" == aarch64 && "$python_elf" == 183 && "$module_elf" == 183 ]] ||
  { say "$image is not an arm64 image throughout"; exit 1; }
tail -n 4 "$timings"
