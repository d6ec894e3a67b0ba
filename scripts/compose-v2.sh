#!/usr/bin/env bash
# Compose v2 for tests/engine/test_compose.py (it runs a pin's compose.yaml with it), the same
# for `make test` and .ci/run so that a user's run and CI's run the same tests.
# Debian 12 packages only docker-compose 1.29, which is end of life and refuses the Compose
# spec's keys; Debian 13's docker-compose package is Compose v2 (a static Go binary). Its .deb is
# fetched from this machine's own Debian mirror, checked by sha256 and unpacked into build/tools/
# only: nothing is installed system-wide, and an engine's own Compose v2 plugin (`docker
# compose`, Docker CE's docker-compose-plugin) is used as it is instead. Needs no root where
# curl and dpkg-deb are installed. Safe to run again.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

COMPOSE_DEB=docker-compose_2.26.1-4_amd64.deb
COMPOSE_SHA256=47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea
COMPOSE_BIN=build/tools/docker-compose

if docker compose version 2>/dev/null | grep -q ' v\?2\.'; then
  echo "compose: Compose v2 found: $(docker compose version)"
  exit 0
fi
if [ -x "$COMPOSE_BIN" ] && "$COMPOSE_BIN" version 2>/dev/null | grep -q ' v\?2\.'; then
  echo "compose: Compose v2 found: $("$COMPOSE_BIN" version)"
  exit 0
fi
if [ "$(dpkg --print-architecture 2>/dev/null)" != amd64 ]; then
  echo "compose: no Compose v2 for $(dpkg --print-architecture 2>/dev/null || uname -m) here;" \
    "install docker-compose-plugin, or set SM120_STACKS_COMPOSE=BINARY" >&2
  exit 2
fi
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
  || true)
mirror=${mirror:-$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)}
mirror=${mirror:-http://deb.debian.org/debian}
echo "compose: installing Compose v2 into $COMPOSE_BIN (Debian 13's $COMPOSE_DEB)"
if ! command -v curl >/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "compose: curl is missing: sudo apt-get install curl, then run again" >&2
    exit 2
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q curl >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsS --retry 3 -o "$tmp/$COMPOSE_DEB" "$mirror/pool/main/d/docker-compose/$COMPOSE_DEB"
echo "$COMPOSE_SHA256  $tmp/$COMPOSE_DEB" | sha256sum --check --quiet
dpkg-deb -x "$tmp/$COMPOSE_DEB" "$tmp/root"
mkdir -p "$(dirname "$COMPOSE_BIN")"
install -m 0755 "$tmp/root/usr/libexec/docker/cli-plugins/docker-compose" "$COMPOSE_BIN"
echo "compose: $("$COMPOSE_BIN" version)"
