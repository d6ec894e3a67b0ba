# shellcheck shell=bash disable=SC2034
# Sourced by the base scripts: sets the array `build` to a BuildKit-capable build command.
# buildx when the client has it, else a client that still builds with DOCKER_BUILDKIT=1 (Debian
# 12's docker.io 20.10 is /usr/bin/docker; the 28.x client refuses without buildx). Never export
# DOCKER_BUILDKIT globally: it breaks the 28.x client on PATH.
#   DOCKER=docker . scripts/buildkit-client.sh && "${build[@]}" -t IMAGE CONTEXT
if "${DOCKER:-docker}" buildx version >/dev/null 2>&1; then
  build=("${DOCKER:-docker}" buildx build --load)
elif [[ -x /usr/bin/docker ]]; then
  build=(env DOCKER_BUILDKIT=1 /usr/bin/docker build)
else
  build=(env DOCKER_BUILDKIT=1 "${DOCKER:-docker}" build)
fi
