#!/usr/bin/env bash
# Build a local Debian + Python base image without any image registry:
# debootstrap a minimal rootfs from Debian's packages, then `docker import` it.
# Idempotent: does nothing when the image already exists, unless FORCE=1.
#
#   sudo scripts/make-base-local.sh               # -> local/debian-python:bookworm
#   FORCE=1 scripts/make-base-local.sh            # rebuild
#
# Environment: BASE_IMAGE, SUITE, DEBIAN_MIRROR, DOCKER (client binary), FORCE.
set -euo pipefail

IMAGE="${BASE_IMAGE:-local/debian-python:bookworm}"
SUITE="${SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DOCKER="${DOCKER:-docker}"
PACKAGES="python3,python3-venv,python3-pip,ca-certificates"

if [[ "${FORCE:-0}" != 1 ]] && "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "make-base-local: $IMAGE already exists (FORCE=1 to rebuild)"
  exit 0
fi
[[ $EUID -eq 0 ]] || { echo "make-base-local: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "make-base-local: apt-get install debootstrap" >&2; exit 1; }

tmp="$(mktemp -d /var/tmp/make-base-local.XXXXXX)"
cleanup() {
  # debootstrap mounts proc/sys inside the target; never let rm walk into them.
  for m in proc sys dev/pts dev; do umount -l "$tmp/rootfs/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT

start=$SECONDS
echo "make-base-local: debootstrap $SUITE from $MIRROR ..."
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp/rootfs" "$MIRROR" \
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
tar --numeric-owner -C "$tmp/rootfs" -c . | "$DOCKER" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase --include=$PACKAGES $SUITE" \
  - "$IMAGE" >/dev/null

# Smoke check: a shell, coreutils and a Python with a working venv module.
"$DOCKER" run --rm --network none "$IMAGE" /bin/sh -c \
  'ls / >/dev/null && python3 -c "import sys, venv, ensurepip; print(sys.version.split()[0])"'
echo "make-base-local: built $IMAGE in $((SECONDS - start)) s," \
  "$("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
