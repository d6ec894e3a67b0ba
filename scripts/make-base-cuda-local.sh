#!/usr/bin/env bash
# Build a local CUDA 13.0.2 devel base image without any image registry: Debian 12 (the image of
# scripts/make-base-local.sh) + NVIDIA's CUDA 13.0.2 component wheels from PyPI, laid out as
# /usr/local/cuda-13.0 (bases/cuda-13.0-devel/Dockerfile). It stands in for
# nvidia/cuda:13.0.2-devel-ubuntu24.04 where that cannot be pulled.
# Idempotent: does nothing when the image already exists, unless FORCE=1. Made once, whoever
# asks (issue 46): a second run at the same time waits for the first (flock) and takes its
# result; the image is made under IMAGE-recipe-<hash of this script, its Dockerfile and the
# Debian base's image ID> with that hash in its sm120-stacks.base-recipe label, smoke-checked,
# and only then tagged IMAGE. A run whose recipe image exists tags it, building nothing.
#
#   scripts/make-base-cuda-local.sh               # -> local/cuda:13.0.2-devel-bookworm
#   FORCE=1 scripts/make-base-cuda-local.sh       # rebuild (BuildKit's layer cache still applies)
#   FORCE=1 NO_CACHE=1 scripts/make-base-cuda-local.sh   # rebuild every layer
#
# Environment: CUDA_IMAGE (the image to make), BASE_IMAGE (the Debian + Python image it starts from;
# made by scripts/make-base-local.sh when missing), CA_BUNDLE or SM120_STACKS_CA_BUNDLE (CA file passed
# as the `proxy-ca` BuildKit secret for pip, `none` for no secret; default: the host's system trust
# store, resolved as `sm120-stacks build` resolves --ca-bundle), PYTHON (runs that resolver; any
# Python 3.11+), DOCKER (client binary), FORCE, NO_CACHE.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
IMAGE="${CUDA_IMAGE:-local/cuda:13.0.2-devel-bookworm}"
BASE="${BASE_IMAGE:-local/debian-python:bookworm}"
CONTEXT="$root/bases/cuda-13.0-devel"
DOCKER="${DOCKER:-docker}"

SCRIPT_NAME=make-base-cuda-local
# shellcheck source=scripts/base-recipe.sh
. "$here/base-recipe.sh"
base_lock make-base-cuda-local "$IMAGE"
if [[ "${FORCE:-0}" != 1 ]] && "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "make-base-cuda-local: $IMAGE already exists (FORCE=1 to rebuild)"
  exit 0
fi
[[ -f "$CONTEXT/Dockerfile" ]] || { echo "make-base-cuda-local: $CONTEXT/Dockerfile is missing" >&2; exit 1; }

# shellcheck source=scripts/buildkit-client.sh
. "$here/buildkit-client.sh"   # sets build=(...): a BuildKit-capable build command

if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  echo "make-base-cuda-local: $BASE is missing; making it with scripts/make-base-local.sh"
  BASE_IMAGE="$BASE" DOCKER="$DOCKER" FORCE=0 "$here/make-base-local.sh"
fi
# The Debian base by content: its tag may move while this builds (another run, FORCE=1).
base_id="$("$DOCKER" image inspect --format '{{.Id}}' "$BASE")"
base_ref="$(content_tag "$BASE" "$base_id")"
"$DOCKER" tag "$base_id" "$base_ref"
mapfile -t recipe_files < <(find "$CONTEXT" -type f | LC_ALL=C sort)
recipe="$(recipe_hash "${BASH_SOURCE[0]}" "${recipe_files[@]}" -- "$base_id")"
recipe_tag="$IMAGE-recipe-${recipe:0:16}"
if [[ "${FORCE:-0}" != 1 && -n "$(recipe_image "$recipe_tag" "$recipe")" ]]; then
  publish make-base-cuda-local "$IMAGE" "$recipe_tag"
  echo "make-base-cuda-local: $IMAGE is $recipe_tag, made before from the same recipe"
  exit 0
fi

args=(--network host --progress=plain --build-arg "BASE_IMAGE=$base_ref" -t "$recipe_tag"
  --label "$RECIPE_LABEL=$recipe" -f "$CONTEXT/Dockerfile")
python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python=python3
ca_bundle="$(PYTHONPATH="$root" "$python" -m builder.image.cabundle "${CA_BUNDLE:-${SM120_STACKS_CA_BUNDLE:-}}")" || {
  echo "make-base-cuda-local: set CA_BUNDLE to an existing file, or to none" >&2; exit 2; }
if [[ -n "$ca_bundle" ]]; then
  args+=(--secret "id=proxy-ca,src=$ca_bundle")
fi
if [[ "${NO_CACHE:-0}" == 1 ]]; then args+=(--no-cache); fi

start=$SECONDS
echo "make-base-cuda-local: ${build[*]} ${args[*]} $CONTEXT"
"${build[@]}" "${args[@]}" "$CONTEXT"
elapsed=$((SECONDS - start))

# Smoke check outside the build: the toolkit answers from a fresh container, offline. IMAGE
# names the new image only once it passed.
"$DOCKER" run --rm --network none "$recipe_tag" nvcc --version | grep 'release 13.0, V13.0.88'
publish make-base-cuda-local "$IMAGE" "$recipe_tag"
echo "make-base-cuda-local: built $IMAGE in ${elapsed} s," \
  "$("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
