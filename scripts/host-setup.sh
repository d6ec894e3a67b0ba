#!/usr/bin/env bash
# Bring up what the two commands need on this machine: a Docker engine with BuildKit and, with
# --registry, a local image registry on 127.0.0.1:5000. Idempotent and quick when all is up
# (two HTTP pings), so `make stack` and `make test` run it every time; .ci/run calls it too.
#
#   scripts/host-setup.sh              # the engine (make stack)
#   scripts/host-setup.sh --registry   # the engine and the local registry (make test, CI)
#
# Installs only on Debian as root (apt: docker.io, docker-registry, debootstrap, curl, openssl;
# docker-buildx where the release packages it). Elsewhere, or not root, it says what to run.
set -euo pipefail

LOG_DIR=/var/log/sm120-stacks
REGISTRY_CONFIG=/etc/sm120-stacks/registry.yml
REGISTRY_DATA=/var/lib/sm120-stacks/registry
REGISTRY=127.0.0.1:5000
want_registry=0
[[ "${1:-}" == --registry ]] && want_registry=1

say() { echo "host-setup: $*" >&2; }
engine_up() { docker_ping >/dev/null 2>&1; }
docker_ping() {
  if [[ -n "${DOCKER_HOST:-}" ]]; then docker version --format '{{.Server.Version}}'
  else curl -sf --unix-socket /var/run/docker.sock http://localhost/_ping; fi
}
registry_up() { curl -sf --noproxy '*' "http://$REGISTRY/v2/" >/dev/null 2>&1; }

# wait_for SECONDS LOG CMD...: poll CMD once a second; on timeout show LOG and fail.
wait_for() {
  local secs=$1 log=$2; shift 2
  for ((i = 0; i < secs; i++)); do "$@" && return 0; sleep 1; done
  say "timed out after ${secs}s waiting for: $*; last lines of $log:"
  tail -n 40 "$log" >&2 || true
  return 1
}

if engine_up && { ((want_registry == 0)) || registry_up; }; then exit 0; fi

script="$(readlink -f "${BASH_SOURCE[0]}")"
fix_cmd="sudo $script${1:+ $1}"
if [[ ! -r /etc/debian_version ]]; then
  say "this machine is not Debian; start a Docker engine with BuildKit yourself"
  ((want_registry)) && say "and a registry on $REGISTRY (e.g. docker run -d -p $REGISTRY:5000 registry:2)"
  exit 2
fi
if ((EUID != 0)); then
  say "no Docker engine answers and installing one needs root: run  $fix_cmd"
  exit 2
fi

# 1. Packages. Debian 12: engine 20.10 whose /usr/bin/docker builds with DOCKER_BUILDKIT=1;
#    later releases package buildx separately as docker-buildx.
pkgs=(docker.io docker-registry debootstrap curl openssl)
if ! dpkg -s "${pkgs[@]}" >/dev/null 2>&1; then
  say "installing ${pkgs[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  if apt-cache show docker-buildx >/dev/null 2>&1; then pkgs+=(docker-buildx); fi
  apt-get install -y -q "${pkgs[@]}" >/dev/null
fi
mkdir -p "$LOG_DIR"

# 2. The engine. Under systemd, let it own the daemon; in a container or a bare VM, start it.
if ! engine_up; then
  if [[ -d /run/systemd/system ]] && systemctl start docker 2>/dev/null; then
    say "started docker.service"
  else
    say "starting dockerd (log: $LOG_DIR/dockerd.log)"
    setsid dockerd >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null &
  fi
  wait_for 60 "$LOG_DIR/dockerd.log" engine_up
fi

# 3. The local registry (distribution 2.8), loopback only, no auth.
if ((want_registry)) && ! registry_up; then
  mkdir -p "$(dirname "$REGISTRY_CONFIG")" "$REGISTRY_DATA"
  cat >"$REGISTRY_CONFIG" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $REGISTRY_DATA
  delete:
    enabled: true
http:
  addr: $REGISTRY
YAML
  say "starting docker-registry on $REGISTRY (log: $LOG_DIR/registry.log)"
  setsid docker-registry serve "$REGISTRY_CONFIG" >>"$LOG_DIR/registry.log" 2>&1 </dev/null &
  wait_for 30 "$LOG_DIR/registry.log" registry_up
fi
