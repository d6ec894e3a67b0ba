#!/usr/bin/env bash
# Bring up what the two commands need on this machine: a Docker engine with BuildKit and, with
# --registry, a local image registry on 127.0.0.1:5000 (SM120_STACKS_REGISTRY=127.0.0.1:PORT for
# another port). Idempotent and quick when all is up (two pings), so `make stack` and `make test`
# run it every time; .ci/run calls it too.
#
#   scripts/host-setup.sh              # the engine (make stack)
#   scripts/host-setup.sh --registry   # the engine and the local registry (make test, CI)
#
# What it never does (docs/gpu-host.md): remove, replace, restart or reconfigure an engine it did
# not install. Any engine present (a socket that answers, docker.service, dockerd, a docker-ce /
# moby-engine / containerd.io / podman / docker.io package, the Docker snap, rootless Docker)
# means nothing engine-related is installed; a stopped one is started through systemd (without
# systemd: Debian's docker.io as a bare dockerd, as host-setup runs its own) or the command to
# run is printed. What an engine cannot do here is said in one line: podman has no BuildKit
# (it can pin and deploy, not build); containerd alone (a Kubernetes node) is no Docker engine;
# rootless Docker and the snap answer on sockets and configs of their own. Every apt
# install is simulated first and refused if it would remove a package; apt's output goes to
# /var/log/sm120-stacks/apt.log and its error lines are shown. Packages install with service
# starts forbidden (policy-rc.d), and the docker-registry package's own service (all interfaces,
# :5000) is disabled: the only registry started is ours, on loopback. Installs on Debian and
# Ubuntu as root; elsewhere it prints the commands to run.
set -euo pipefail

LOG_DIR=/var/log/sm120-stacks
APT_LOG=$LOG_DIR/apt.log
STATE_DIR=/var/lib/sm120-stacks
ENGINE_MARK=$STATE_DIR/engine-installed-by-host-setup
REGISTRY_CONFIG=/etc/sm120-stacks/registry.yml
REGISTRY_DATA=$STATE_DIR/registry
POLICY=/usr/sbin/policy-rc.d
ENGINE_PACKAGES=(docker-ce docker-ce-cli moby-engine containerd.io podman docker.io)

want_registry=0
case "${1:-}" in
  --registry) want_registry=1 ;;
  "") ;;
  *) echo "usage: $0 [--registry]" >&2; exit 2 ;;
esac
script="$(readlink -f "${BASH_SOURCE[0]}")"
fix_cmd="sudo $script${1:+ $1}"

say() { echo "host-setup: $*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }
systemd_host() { [[ -d /run/systemd/system ]]; }
installed() { [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null) == ii* ]]; }
engine_up() { docker_ping >/dev/null 2>&1; }
docker_ping() {
  if [[ -n "${DOCKER_HOST:-}" ]]; then docker version --format '{{.Server.Version}}'
  else curl -sf -m 5 --unix-socket /var/run/docker.sock http://localhost/_ping; fi
}

PODMAN_LINE="podman can pin and deploy (GPUs through CDI: nvidia-ctk cdi generate, docs/gpu-host.md), but its API has no BuildKit: builds need Docker with BuildKit"

# engine_notes: one line for an engine that answers but is not the plain rootful Docker the
# tool's build and systemd unit assume (podman's API, rootless Docker); nothing otherwise.
engine_notes() {
  local version
  [[ -n "${DOCKER_HOST:-}" ]] || return 0
  version=$(docker version --format '{{range .Server.Components}}{{.Name}} {{end}}' 2>/dev/null || true)
  if [[ $version == *Podman* || $DOCKER_HOST == *podman* ]]; then
    say "DOCKER_HOST is podman's API: $PODMAN_LINE"
  elif [[ $DOCKER_HOST == unix:///run/user/* ]]; then
    say "DOCKER_HOST is rootless Docker: build, test and deploy --apply use it; the rendered systemd unit talks to the rootful socket (docs/gpu-host.md, Rootless Docker)"
  fi
}

# The registry: SM120_STACKS_REGISTRY (the tool's and the tests' own setting) when it is a
# loopback HOST:PORT; another registry is the user's to run, and is left alone.
registry=${SM120_STACKS_REGISTRY:-127.0.0.1:5000}
registry=${registry%%/*}
if ((want_registry)) && [[ ! $registry =~ ^(127\.0\.0\.1|localhost):([0-9]+)$ ]]; then
  say "SM120_STACKS_REGISTRY=$registry is not 127.0.0.1:PORT: host-setup starts no registry for it"
  want_registry=0
fi
port=${registry##*:}

# registry_state: ours (a registry answering 200 on /v2/ without auth), free (nothing listens),
# taken (something else answers: a registry asking for a login, or not a registry at all), or
# unknown (something listens and curl is not installed yet).
registry_state() {
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo free; return; }
  have curl || { echo unknown; return; }
  local head
  head=$(curl -s -m 5 --noproxy '*' -o /dev/null -D - "http://127.0.0.1:$port/v2/" | tr -d '\r' || true)
  if [[ $head == "HTTP/"*" 200"* ]] && grep -qi '^docker-distribution-api-version:' <<<"$head"; then
    echo ours
  else
    echo "taken ${head%%$'\n'*}"
  fi
}

port_taken() {
  local answer=${1#taken} said=" but not over HTTP"
  [[ -n ${answer# } ]] && said=" '${answer# }'"
  say "port $port is taken: 127.0.0.1:$port answers$said, not as an open registry"
  say "  see what it is:  ss -ltnp 'sport = :$port'"
  say "  if it is the docker-registry package's own service (on all interfaces; an earlier"
  say "  host-setup left it enabled):  systemctl disable --now docker-registry"
  say "    (without systemd: service docker-registry stop && update-rc.d docker-registry disable)"
  say "  or use another port:  SM120_STACKS_REGISTRY=127.0.0.1:$((port + 1)) $script --registry"
  say "    and the same SM120_STACKS_REGISTRY for make test / .ci/run"
  exit 2
}

# wait_for SECONDS WHERE CMD...: poll CMD once a second; on timeout say where to look and fail.
wait_for() {
  local secs=$1 where=$2; shift 2
  for ((i = 0; i < secs; i++)); do "$@" && return 0; sleep 1; done
  say "timed out after ${secs}s waiting for: $*"
  if [[ -f $where ]]; then say "last lines of $where:"; tail -n 40 "$where" >&2 || true
  else say "see: $where"; fi
  return 1
}

registry_ours() { [[ $(registry_state) == ours ]]; }

# --- apt: simulated first, never removing a package, its output kept -------------------------

# apt_errors FILE: the lines of apt's output that say why it failed (they go to stdout, which
# a user would otherwise never see: "containerd.io : Conflicts: containerd" and the E: lines).
apt_errors() {
  grep -E '^(E|W): |unmet dependencies|^ [^ ]+ : |^ +(Pre)?Depends: |^ +(Conflicts|Breaks): ' "$1" \
    | tail -n 25 | sed 's/^/  apt: /' >&2 || true
}

# apt_run FILE CMD...: CMD with its output in FILE and appended to the log.
apt_run() {
  local out=$1 rc=0; shift
  { echo "== $(date -u +%FT%TZ) $*"; } >>"$APT_LOG"
  DEBIAN_FRONTEND=noninteractive "$@" >"$out" 2>&1 || rc=$?
  cat "$out" >>"$APT_LOG"
  return $rc
}

# no_service_starts CMD...: CMD under a policy-rc.d that forbids every service start (101), so a
# package's postinst starts nothing (docker-registry's would serve [::]:5000). The previous
# policy-rc.d, if any, is put back, also when host-setup is interrupted (a policy-rc.d left
# behind would stop every later package from starting its service).
policy_saved=""
restore_policy() {
  if [[ -n $policy_saved ]]; then mv -f "$policy_saved" "$POLICY"; else rm -f "$POLICY"; fi
  trap - EXIT INT TERM
}
no_service_starts() {
  local rc=0
  policy_saved=""
  if [[ -e $POLICY ]]; then policy_saved=$(mktemp); cp -p "$POLICY" "$policy_saved"; fi
  trap 'restore_policy; exit 130' INT TERM
  trap restore_policy EXIT
  printf '#!/bin/sh\n# written by sm120-stacks host-setup for one apt run\nexit 101\n' >"$POLICY"
  chmod 755 "$POLICY"
  "$@" || rc=$?
  restore_policy
  return $rc
}

what_the_release_packages() {
  local version
  version=$(. "$os_release" && echo "${VERSION_ID:-}")
  case "$os_id $version" in
    "debian 12") echo "docker.io 20.10 (BuildKit through DOCKER_BUILDKIT=1; no docker-buildx package)" ;;
    debian*) echo "docker.io, and docker-buildx where the release has it" ;;
    ubuntu*) echo "docker.io and docker-buildx from universe (24.04: both there)" ;;
  esac
}

# apt_install PKG...: install those not installed yet, or refuse and say why.
apt_install() {
  local want=() p out removed missing=()
  for p in "$@"; do installed "$p" || want+=("$p"); done
  ((${#want[@]})) || return 0
  out=$LOG_DIR/apt-last.out  # the last apt command's output (all of it is in the log)
  if ! apt_run "$out" apt-get update -q || grep -qE '^(E: |W: Failed to fetch)' "$out"; then
    say "apt-get update failed; going on with the package lists already here (log: $APT_LOG):"
    grep -E '^(E: |W: Failed to fetch)' "$out" | tail -n 5 | sed 's/^/  apt: /' >&2 || true
  fi
  if [[ " ${want[*]} " == *" docker.io "* ]] && apt_has docker-buildx; then want+=(docker-buildx); fi
  for p in "${want[@]}"; do apt_has "$p" || missing+=("$p"); done
  if ((${#missing[@]})); then
    say "$os_name's package lists have no ${missing[*]}: nothing was installed"
    [[ $os_id == ubuntu ]] && say "  they are in universe: add-apt-repository universe && apt-get update, then run again"
    exit 2
  fi
  if ! apt_run "$out" apt-get install -s -y -q "${want[@]}"; then
    say "apt refuses to install ${want[*]}; nothing was installed. apt says (log: $APT_LOG):"
    apt_errors "$out"
    exit 2
  fi
  removed=$(awk '/^(Remv|Purg) /{printf " %s", $2}' "$out")
  if [[ -n $removed ]]; then
    say "installing ${want[*]} would REMOVE${removed} (apt-get install -s says so)."
    say "  host-setup never removes a package: nothing was installed. Decide what to keep:"
    say "  remove${removed} yourself, or install ${want[*]} yourself"
    say "  (apt-get install ${want[*]} shows the plan first); then run again"
    exit 2
  fi
  say "installing ${want[*]} (apt, services not started; log: $APT_LOG)"
  if ! no_service_starts apt_run "$out" apt-get install -y -q "${want[@]}"; then
    say "apt-get install failed (log: $APT_LOG):"
    apt_errors "$out"
    exit 1
  fi
  if [[ " ${want[*]} " == *" docker-registry "* ]]; then disable_packaged_registry; fi
}

# (here-strings, not pipes into grep -q: with pipefail a writer cut off early reads as false)
apt_has() { grep -q '^ *Candidate: [^(]' <<<"$(apt-cache policy "$1" 2>/dev/null)"; }

# The docker-registry package enables its own service, on :5000 of every interface: off, at once
# and at boot. Ours runs with our loopback config only.
disable_packaged_registry() {
  if systemd_host; then
    systemctl disable --now docker-registry.service >>"$APT_LOG" 2>&1 || true
  elif [[ -x /etc/init.d/docker-registry ]] && have update-rc.d; then
    update-rc.d docker-registry disable >>"$APT_LOG" 2>&1 || true
  fi
}

# --- the engine ----------------------------------------------------------------------------------

# engine_evidence: one line per sign of an installed engine (packages, unit, binary, socket).
engine_evidence() {
  local p d
  for p in "${ENGINE_PACKAGES[@]}"; do installed "$p" && echo "package $p"; done
  for d in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
    [[ -e $d/docker.service ]] && { echo "unit $d/docker.service"; break; }
  done
  have dockerd && echo "$(command -v dockerd)"
  [[ -S /var/run/docker.sock ]] && echo "socket /var/run/docker.sock"
  # The Docker snap (Ubuntu Server's installer offers it): no deb, its own unit and socket.
  if [[ -e /snap/bin/docker ]] || snap_unit >/dev/null; then echo "snap docker"; fi
  # Rootless Docker (docker-ce-rootless-extras): a user's dockerd on a socket of their own.
  have dockerd-rootless.sh && echo "rootless $(command -v dockerd-rootless.sh)"
  return 0
}

snap_unit() {
  local d
  for d in /etc/systemd/system /lib/systemd/system; do
    [[ -e $d/snap.docker.dockerd.service ]] && { echo "$d/snap.docker.dockerd.service"; return 0; }
  done
  return 1
}

# debian_docker_io_only: the engine here is Debian's docker.io package and nothing else (no
# docker-ce, moby-engine, containerd.io or podman package beside it).
debian_docker_io_only() {
  local p
  installed docker.io || return 1
  for p in "${ENGINE_PACKAGES[@]}"; do
    [[ $p == docker.io ]] || ! installed "$p" || return 1
  done
}

has_docker_unit() { grep -q '^unit ' <<<"$(engine_evidence)"; }

# containerd_only: containerd.io and no Docker engine beside it (a Kubernetes node).
containerd_only() {
  local evidence
  evidence=$(engine_evidence)
  grep -q '^package containerd.io$' <<<"$evidence" \
    && ! grep -qE '^(package (docker|moby|podman)|unit |/|snap |rootless )' <<<"$evidence"
}

# start_engine: the engine that is here, started the way it is meant to be: systemd's unit on a
# systemd host (never a bare dockerd there); on a host without systemd (a container, CI) a bare
# dockerd only for Debian's docker.io, the engine host-setup itself installs and runs that way
# (whether this run, an earlier one or the machine's image installed it: its init script fails
# in a container, `ulimit: error setting limit`); otherwise the command to run, and exit 2.
start_engine() {
  local found
  found=$(engine_evidence | paste -sd, - | sed 's/,/, /g')
  if [[ $found == *"snap docker"* ]] && ! debian_docker_io_only && ! installed docker-ce; then
    # The snap's engine serves /var/run/docker.sock; a docker.io beside it would fight it for
    # the socket at every boot, so none is installed: the snap is started as snapd runs it.
    if systemd_host && snap_unit >/dev/null; then
      say "the Docker snap is installed but stopped ($found): systemctl start snap.docker.dockerd (snap start docker)"
      if ! systemctl start snap.docker.dockerd >>"$LOG_DIR/engine.log" 2>&1; then
        say "starting the snap failed: see  snap logs docker; snap services docker"
        exit 1
      fi
      wait_for 60 "snap logs docker" engine_up
      say "started the Docker snap"
      return 0
    fi
    say "the Docker snap is installed ($found) but none answers on /var/run/docker.sock;"
    say "  host-setup installs no second engine beside it. Start it: snap start docker, then run again"
    exit 2
  fi
  if systemd_host && has_docker_unit; then
    say "the engine is installed but stopped ($found): systemctl start docker"
    if ! systemctl start docker >>"$LOG_DIR/engine.log" 2>&1; then
      say "systemctl start docker failed: see  systemctl status docker; journalctl -u docker"
      exit 1
    fi
    wait_for 60 "journalctl -u docker" engine_up
    say "started docker.service"
  elif ! systemd_host && debian_docker_io_only; then
    [[ -e $ENGINE_MARK ]] || say "Debian's docker.io is installed (not by host-setup) and stopped"
    say "starting dockerd (log: $LOG_DIR/dockerd.log)"
    mkdir -p "$LOG_DIR"
    setsid dockerd >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null &
    wait_for 60 "$LOG_DIR/dockerd.log" engine_up
  else
    say "an engine is installed ($found) but none answers on /var/run/docker.sock;"
    say "  host-setup installs, replaces and restarts no engine it did not install. Start it:"
    if [[ $found == *"package podman"* && $found != *docker* ]]; then
      say "  systemctl enable --now podman.socket, then export DOCKER_HOST=unix:///run/podman/podman.sock"
      say "  $PODMAN_LINE"
    elif [[ $found == *"rootless "* && $found != *"package docker-ce"* && $found != *"unit "* ]]; then
      say "  rootless Docker, as the user who runs it: systemctl --user start docker, then"
      say "  export DOCKER_HOST=unix://\$XDG_RUNTIME_DIR/docker.sock and run again as that user"
      say "  (the rendered systemd unit talks to the rootful socket: docs/gpu-host.md, Rootless Docker)"
    elif containerd_only; then
      say "  containerd alone is no Docker engine (a Kubernetes node's runtime: it never serves"
      say "  /var/run/docker.sock). Install Docker CE beside it from Docker's apt repository"
      say "  (https://docs.docker.com/engine/install/): apt-get install docker-ce docker-ce-cli;"
      say "  Debian's docker.io would conflict with containerd.io. Or leave this node to Kubernetes:"
      say "  sm120-stacks deploy HOST --format k8s renders the pin for it"
    elif systemd_host; then
      say "  the way it was installed (no docker.service here), then run again"
    elif [[ -x /etc/init.d/docker ]]; then
      say "  service docker start"
    else
      say "  dockerd, the way this machine starts services, then run again"
    fi
    exit 2
  fi
}

state=free
if ((want_registry)); then state=$(registry_state); fi
if engine_up && [[ $state == ours || $want_registry == 0 ]]; then engine_notes; exit 0; fi
[[ $state == taken* ]] && port_taken "$state"
if [[ -n "${DOCKER_HOST:-}" ]]; then
  say "DOCKER_HOST=$DOCKER_HOST does not answer; host-setup manages only this machine's engine"
  say "  start that engine, or unset DOCKER_HOST"
  exit 2
fi

# The system: Debian and Ubuntu are handled; anything else is told what to run.
os_id="" os_name="this system" os_release=/etc/os-release
[[ -r $os_release ]] || os_release=/usr/lib/os-release  # os-release(5)'s fallback
if [[ -r $os_release ]]; then
  os_id=$(. "$os_release" && echo "${ID:-}")
  os_name=$(. "$os_release" && echo "${PRETTY_NAME:-${ID:-this system}}")
fi
if [[ $os_id != debian && $os_id != ubuntu ]]; then
  say "$os_name is not Debian or Ubuntu: host-setup installs nothing here. Run:"
  engine_up || say "  a Docker engine with BuildKit (https://docs.docker.com/engine/install/), started"
  ((want_registry)) && say "  a registry on 127.0.0.1:$port only: docker run -d -p 127.0.0.1:$port:5000 registry:2"
  exit 2
fi
if ((EUID != 0)); then
  say "no Docker engine answers$( ((want_registry)) && echo " or no registry on 127.0.0.1:$port") and setting them up needs root: run  $fix_cmd"
  exit 2
fi
mkdir -p "$LOG_DIR" "$STATE_DIR"

# 1. What an engine is already here (whoever installed it), and the packages to install.
mapfile -t engine_found < <(engine_evidence)
pkgs=()
have curl || pkgs+=(curl)
((want_registry)) && pkgs+=(docker-registry debootstrap openssl)
if ((${#engine_found[@]} == 0)) && ! engine_up; then
  pkgs+=(docker.io)
  say "no engine here; $os_name: $(what_the_release_packages)"
fi
apt_install "${pkgs[@]}"
installed docker.io && [[ " ${pkgs[*]} " == *" docker.io "* ]] && touch "$ENGINE_MARK"

# 2. The engine: ours, or the one that was here, through its own service manager.
engine_up || start_engine

# 3. The local registry (distribution 2.8), loopback only, no auth, our config only.
if ((want_registry)); then
  state=$(registry_state)
  [[ $state == taken* ]] && port_taken "$state"
  if [[ $state != ours ]]; then
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
  addr: 127.0.0.1:$port
YAML
    say "starting docker-registry on 127.0.0.1:$port (log: $LOG_DIR/registry.log)"
    # env -i: no REGISTRY_HTTP_ADDR or other REGISTRY_* variable can override the config.
    setsid env -i PATH="$PATH" docker-registry serve "$REGISTRY_CONFIG" \
      >>"$LOG_DIR/registry.log" 2>&1 </dev/null &
    wait_for 30 "$LOG_DIR/registry.log" registry_ours
  fi
fi
