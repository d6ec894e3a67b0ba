#!/usr/bin/env bash
# A warm cache restored on a second host of the namespace fleet (issue 24 item 5;
# `make bench-warm-fleet`; raw logs: bench/results/warm-fleet/). Two hosts, each a network
# namespace with its own sshd and dockerd (scripts/fleet-netns.sh, fleet sm120-warm on
# 10.234.I.2), reached over ssh as real hosts are:
#
#  1. the warm-test server of tests/engine/test_warm.py (it "compiles" a kernel into
#     TRITON_CACHE_DIR at its first start, and loads it when it is there) pushed to the
#     registry, and pinned on both hosts alike (same image, command, env and cache mount);
#  2. host 1 deployed: a cold start (no artifact for this image yet); `cache prove` says what it
#     compiled;
#  3. `cache capture h1`: its cache volume pushed beside the image as an OCI artifact;
#  4. host 2 deployed with --require-warm: the artifact restored into its fresh volume before the
#     start; `cache prove h2` must say nothing was compiled (exit 0);
#  5. the kernel's bytes and mtime read on each host's engine: the same file, loaded, not made.
#
# The pins are written as test_warm.py writes them (the server is no stack of stacks/, so
# `pin` has no record to pin from); its port is published beyond loopback for the health gate
# and the server has no key to check, so the pins say no_auth (verify would show it).
# The namespaces and their engines are torn down at the end; this engine keeps no tag of it.
set -euo pipefail
cd "$(dirname "$0")/.."

REGISTRY=${REGISTRY:-127.0.0.1:5000}
RUN_ID=${RUN_ID:-$(head -c3 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export SM120_FLEET_NAME=sm120-warm SM120_FLEET_NET=${SM120_FLEET_NET:-234}
NET=10.$SM120_FLEET_NET
LOCAL_BASE=local/debian-python:bookworm
REPOSITORY=$REGISTRY/sm120-warm-fleet-$RUN_ID/server
WORK=${WORK:-$(mktemp -d /tmp/sm120-warm-fleet.XXXXXX)}
OUT=${OUT:-$PWD/bench/results/warm-fleet}
CLI=$PWD/.venv/bin/sm120-stacks
PY=$PWD/.venv/bin/python
mkdir -p "$OUT"
SECONDS=0

# stamp, run, must, may, expect
. bench/workspace.sh

started=0
cleanup() {
    stamp "teardown"
    if [[ $started == 1 && ${KEEP:-0} != 1 ]]; then
        scripts/fleet-netns.sh down >"$OUT/teardown.txt" 2>&1 || true
    fi
    docker rmi "$REPOSITORY:1" >/dev/null 2>&1 || true
    [[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT
: >"$OUT/timeline.txt"

stamp "run $RUN_ID: workspace $WORK, image $REPOSITORY"
mkdir -p "$WORK/stacks" "$WORK/hosts"
cp stacks/ci-mini.yaml "$WORK/stacks/"

stamp "1. the warm-test server's image pushed; two hosts; both pinned alike"
[[ -n $(docker images -q "$LOCAL_BASE") ]] || scripts/make-base-local.sh
docker tag "$LOCAL_BASE" "$REPOSITORY:1"
docker push -q "$REPOSITORY:1" >/dev/null
IMAGE=$(docker inspect -f '{{range .RepoDigests}}{{println .}}{{end}}' "$REPOSITORY:1" |
    grep -F "$REPOSITORY@" | head -1)
stamp "image $IMAGE"
scripts/fleet-netns.sh up 2 >"$WORK/fleet.env" 2>"$OUT/fleet-up.txt"
started=1
# shellcheck disable=SC1091
. "$WORK/fleet.env"
"$PY" - "$WORK/hosts" "$IMAGE" "$NET" <<'EOF' | tee -a "$OUT/timeline.txt"
import sys
from pathlib import Path
from builder.hosts.pins import CACHE_ENV, CACHE_TARGET, PIN_SCHEMA, Pin, write_pin
from tests.engine.test_warm import SERVER

hosts, image, net = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
for index in (1, 2):
    host = f"warm-h{index}"
    pin = Pin.model_validate(
        {
            "schema_version": PIN_SCHEMA,
            "host": host,
            "stack": "warm-test",
            "content_hash": "0" * 64,
            "image": image,
            "pinned_at": "2026-12-01T00:00:00Z",
            "container": f"sm120-stacks-{host}",
            "command": ["python3", "-c", SERVER],
            "serve_port": 8000,
            "env": dict(CACHE_ENV),
            "gpus": "none",
            "ports": ["8000:8000"],
            "no_auth": True,
            "volumes": [{"source": "sm120-stacks-cache-warm-test", "target": CACHE_TARGET}],
            "shm_size": "64m",
            "health": {"interval_s": 600, "start_period_s": 60},
            "needs": {"cuda": "13.0.2", "min_driver": None, "targets": {"sm120": "12.0"}},
            "engine": f"ssh://root@{net}.{index}.2",
        }
    )
    print(f"pinned {host}: {write_pin(hosts, pin)} (engine {pin.engine})")
EOF

stamp "2. host 1: a cold start"
must deploy-h1-cold "$CLI" deploy warm-h1 --apply
expect deploy-h1-cold "a cold start"
run prove-h1-cold "$CLI" cache prove warm-h1 || true  # exit 1: it compiled

stamp "3. host 1's cache captured and pushed beside the image"
must capture-h1 "$CLI" cache capture warm-h1
must list-h2-before "$CLI" cache list warm-h2

stamp "4. host 2: restored before its start, warm required"
must deploy-h2-warm "$CLI" deploy warm-h2 --apply --require-warm
expect deploy-h2-warm "restored warm cache sha256:"
must prove-h2-warm "$CLI" cache prove warm-h2
expect prove-h2-warm "nothing compiled since the start"

stamp "5. the kernel on each host (md5, mtime), read by that host's engine"
for i in 1 2; do
    DOCKER_HOST=ssh://root@$NET.$i.2 docker run --rm --network none --entrypoint sh \
        -v sm120-stacks-cache-warm-test:/w:ro "$IMAGE" \
        -c 'f=/w/live/triton/grp0/kernel.cubin; echo "$(md5sum <$f | cut -c1-32) mtime $(stat -c %Y $f) bytes $(stat -c %s $f)"' \
        >"$WORK/kernel-$i.txt"
    stamp "host $i kernel: $(cat "$WORK/kernel-$i.txt")"
done
if cmp -s "$WORK/kernel-1.txt" "$WORK/kernel-2.txt"; then
    stamp "same kernel on both hosts: host 2 loaded host 1's, it compiled none"
else
    stamp "FAILED: the kernels differ"
    exit 1
fi
stamp "done"
