#!/usr/bin/env bash
# Build a local Debian + Python base image without any image registry:
# debootstrap a minimal rootfs from Debian's packages, then `docker import` it.
# Idempotent: does nothing when the image already exists, unless FORCE=1. Made once, whoever
# asks (issue 46): a second run at the same time waits for the first (flock) and takes its
# result; the image is imported as IMAGE-recipe-<hash of this script, suite, mirror, packages,
# arch> with that hash in its sm120-stacks.base-recipe label, smoke-checked, and only then
# tagged IMAGE; a run whose recipe image exists tags it, debootstrapping nothing.
#
#   sudo scripts/make-base-local.sh               # -> local/debian-python:bookworm
#   FORCE=1 scripts/make-base-local.sh            # rebuild
#   sudo scripts/make-base-local.sh --arch arm64  # -> local/debian-python:bookworm-arm64
#
# --arch ARCH (or DEBIAN_ARCH=ARCH): a Debian architecture, amd64 or arm64, the image tagged
# SUITE-ARCH and imported as linux/ARCH. Another architecture than this machine's runs
# debootstrap's second stage under emulation: Debian's qemu-user-static with its binfmt_misc
# handler registered with the F flag (scripts/arm64-emulated.sh sets that up). Without --arch,
# nothing changes: this machine's architecture, untagged by it.
#
# Environment: BASE_IMAGE, SUITE, DEBIAN_MIRROR, DEBIAN_ARCH, DOCKER (client binary), FORCE.
set -euo pipefail

ARCH="${DEBIAN_ARCH:-}"
while (($#)); do
  case "$1" in
    --arch) ARCH="${2:?--arch needs a Debian architecture}"; shift 2 ;;
    --arch=*) ARCH="${1#--arch=}"; shift ;;
    *) echo "make-base-local: unknown argument $1 (usage: $0 [--arch amd64|arm64])" >&2; exit 2 ;;
  esac
done
SUITE="${SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DOCKER="${DOCKER:-docker}"
PACKAGES="python3,python3-venv,python3-pip,ca-certificates"
debootstrap_arch=() platform=()
if [[ -z "$ARCH" ]]; then
  IMAGE="${BASE_IMAGE:-local/debian-python:bookworm}"
else
  case "$ARCH" in
    amd64 | arm64) ;;
    *) echo "make-base-local: --arch $ARCH: only amd64 and arm64 (the stacks' platforms)" >&2; exit 2 ;;
  esac
  IMAGE="${BASE_IMAGE:-local/debian-python:$SUITE-$ARCH}"
  debootstrap_arch=(--arch="$ARCH")
  platform=(--platform "linux/$ARCH")
fi

SCRIPT_NAME=make-base-local
# shellcheck source=scripts/base-recipe.sh
. "$(dirname "${BASH_SOURCE[0]}")/base-recipe.sh"
base_lock make-base-local "$IMAGE"
recipe="$(recipe_hash "${BASH_SOURCE[0]}" -- "$SUITE" "$MIRROR" "$PACKAGES" "${ARCH:-native}")"
recipe_tag="$IMAGE-recipe-${recipe:0:16}"
if [[ -z "$ARCH" ]]; then
  if [[ "${FORCE:-0}" != 1 ]] && "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "make-base-local: $IMAGE already exists (FORCE=1 to rebuild)"
    exit 0
  fi
elif [[ "${FORCE:-0}" != 1 ]]; then
  # Only an image whose config says this architecture counts (a `docker import` on an engine
  # that ignores its --platform says the engine's own).
  have="$("$DOCKER" image inspect --format '{{.Os}}/{{.Architecture}}' "$IMAGE" 2>/dev/null || true)"
  if [[ "$have" == "linux/$ARCH" ]]; then
    echo "make-base-local: $IMAGE ($have) already exists (FORCE=1 to rebuild)"
    exit 0
  fi
  [[ -z "$have" ]] || echo "make-base-local: $IMAGE is $have, not linux/$ARCH: making it again"
fi
if [[ "${FORCE:-0}" != 1 && -n "$(recipe_image "$recipe_tag" "$recipe")" ]]; then
  publish make-base-local "$IMAGE" "$recipe_tag"
  echo "make-base-local: $IMAGE is $recipe_tag, made before from the same recipe"
  exit 0
fi
[[ $EUID -eq 0 ]] || { echo "make-base-local: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "make-base-local: apt-get install debootstrap" >&2; exit 1; }
if [[ -n "$ARCH" && "$ARCH" != "$(dpkg --print-architecture)" ]]; then
  # The second stage runs the target's own binaries (dpkg, maintainer scripts) in a chroot: the
  # kernel must hand them to qemu itself, with the interpreter opened at registration (flag F),
  # since the chroot holds no qemu binary.
  qemu="qemu-$(case "$ARCH" in arm64) echo aarch64 ;; amd64) echo x86_64 ;; esac)"
  handler="/proc/sys/fs/binfmt_misc/$qemu"
  if ! grep -qx enabled "$handler" 2>/dev/null || ! grep -q '^flags:.*F' "$handler"; then
    echo "make-base-local: $ARCH binaries cannot run here: no $qemu binfmt_misc handler with the" \
      "F flag ($handler). Install and register it: apt-get install qemu-user-static" \
      "binfmt-support; mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc;" \
      "update-binfmts --enable $qemu (or: make arm64-emulated)" >&2
    exit 1
  fi
fi

tmp="$(mktemp -d /var/tmp/make-base-local.XXXXXX)"
cleanup() {
  # debootstrap mounts proc/sys inside the target; never let rm walk into them.
  for m in proc sys dev/pts dev; do umount -l "$tmp/rootfs/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT

start=$SECONDS
echo "make-base-local: debootstrap ${debootstrap_arch[*]:+${debootstrap_arch[*]} }$SUITE from $MIRROR ..."
debootstrap "${debootstrap_arch[@]}" --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp/rootfs" "$MIRROR" \
  >"$tmp/debootstrap.log" 2>&1 || {
  echo "make-base-local: debootstrap failed; last lines of its log:" >&2
  tail -n 30 "$tmp/debootstrap.log" >&2
  [[ -f "$tmp/rootfs/debootstrap/debootstrap.log" ]] && tail -n 30 "$tmp/rootfs/debootstrap/debootstrap.log" >&2
  exit 1
}

# Slim down: package caches and lists are rebuilt by `apt-get update` when needed.
rm -rf "$tmp"/rootfs/var/cache/apt/archives/*.deb "$tmp"/rootfs/var/cache/apt/*.bin \
       "$tmp"/rootfs/var/lib/apt/lists/* "$tmp"/rootfs/var/log/* "$tmp"/rootfs/tmp/*

echo "make-base-local: importing $IMAGE ..."
if [[ -z "$ARCH" ]]; then
  tar --numeric-owner -C "$tmp/rootfs" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL $RECIPE_LABEL=$recipe" \
    --message "debootstrap --variant=minbase --include=$PACKAGES $SUITE" \
    - "$recipe_tag" >/dev/null
else
  # `docker import --platform` is refused or ignored by engines without experimental features
  # (Debian 12's 20.10 records its own amd64), and BuildKit picks a FROM by the architecture
  # the config records. A BuildKit build FROM scratch records the one --platform names.
  # shellcheck source=scripts/buildkit-client.sh
  . "$(dirname "${BASH_SOURCE[0]}")/buildkit-client.sh"   # sets build=(...)
  mkdir "$tmp/context"
  tar --numeric-owner -C "$tmp/rootfs" -cf "$tmp/context/rootfs.tar" .
  printf '%s\n' 'FROM scratch' 'ADD rootfs.tar /' \
    'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    "LABEL org.opencontainers.image.description=\"debootstrap --arch=$ARCH --variant=minbase --include=$PACKAGES $SUITE\"" \
    "LABEL $RECIPE_LABEL=$recipe" \
    'CMD ["/bin/bash"]' >"$tmp/context/Dockerfile"
  "${build[@]}" --quiet "${platform[@]}" -t "$recipe_tag" "$tmp/context" >/dev/null
fi

# Smoke check: a shell, coreutils and a Python with a working venv module (on the recipe tag:
# IMAGE names the new image only once it passed).
"$DOCKER" run --rm --network none "${platform[@]}" "$recipe_tag" /bin/sh -c \
  'ls / >/dev/null && python3 -c "import sys, venv, ensurepip; print(sys.version.split()[0])"'
if [[ -n "$ARCH" ]]; then
  # The image's config must say its architecture (BuildKit picks a base by it for --platform)
  # and the binaries inside must be that architecture's.
  got="$("$DOCKER" image inspect --format '{{.Os}}/{{.Architecture}}' "$recipe_tag")"
  machine="$("$DOCKER" run --rm --network none "${platform[@]}" "$recipe_tag" uname -m)"
  want_machine="$(case "$ARCH" in arm64) echo aarch64 ;; amd64) echo x86_64 ;; esac)"
  if [[ "$got" != "linux/$ARCH" || "$machine" != "$want_machine" ]]; then
    echo "make-base-local: $IMAGE is $got, uname -m $machine; wanted linux/$ARCH, $want_machine" >&2
    exit 1
  fi
  echo "make-base-local: $IMAGE is $got (uname -m in it: $machine)"
fi
publish make-base-local "$IMAGE" "$recipe_tag"
echo "make-base-local: built $IMAGE in $((SECONDS - start)) s," \
  "$("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
