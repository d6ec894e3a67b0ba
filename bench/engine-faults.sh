#!/usr/bin/env bash
# The engine's own faults, on an engine of this bench's own (bench/FAULTS.md; `make
# bench-faults`): the shared engine is never restarted or pruned. A private dockerd runs in its
# own network namespace (scripts/fleet-netns.sh with its own name and addresses), fed by a
# registry of this bench's own; the tool runs inside that namespace (the smoke reaches its
# server on the namespace's loopback) against that engine's socket.
#
#  0. this machine's engine pushes the base and a copy of ci-mini (with its inline cache) to the
#     bench's registry R; a variant (MAX_JOBS 1: its FlashInfer precompile runs again) is what
#     the private engine builds, tests and pushes;
#  1. the private engine restarted during the build's precompile step, then the build again;
#  2. restarted during a push to an empty registry R2, then the push again;
#  3. restarted during `test` (its smoke server up), then the test again;
#  4. a push to registry R3 whose disk (a small tmpfs) fills;
#  5. `docker system prune -af` on the private engine during `test`, then build and test again.
#
# Each step's output is under bench/results/faults/ (NAME.txt: the command's stdout+stderr and
# exit status; NAME.state.txt: tags, containers, records after it). Root only (namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_ID=${RUN_ID:-$(head -c3 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export SM120_FLEET_NAME=sm120-faults SM120_FLEET_NET=${SM120_FLEET_NET:-232}
WORK=${WORK:-$(mktemp -d /tmp/sm120-faults.XXXXXX)}
OUT=${OUT:-$PWD/bench/results/faults}
CLI=$PWD/.venv/bin/sm120-stacks
PY=$PWD/.venv/bin/python
BASE=local/cuda:13.0.2-devel-bookworm
STACK=fc-$RUN_ID             # a copy of ci-mini under this run's own name
VARIANT=$STACK-jobs1         # MAX_JOBS 1: the precompile step runs again on the private engine
NS=/run/netns/$SM120_FLEET_NAME-h1
ENGINE=unix:///run/$SM120_FLEET_NAME/h1/docker.sock
MODEL=$PWD/build/tiny-model
mkdir -p "$OUT"
SECONDS=0

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
R_PORT=$(free_port)
R=127.0.0.1:$R_PORT
R2=127.0.0.1:5101  # inside the namespace only
R3=127.0.0.1:5102
export SM120_FLEET_REGISTRY_PORT=$R_PORT
SUB=(--substitute-base "$BASE=$R/faults/cuda:13.0.2-devel-bookworm")

stamp() { printf '[%4ds] %s\n' "$SECONDS" "$*" | tee -a "$OUT/timeline.txt"; }
inns() { nsenter "--net=$NS" env DOCKER_HOST="$ENGINE" "$@"; }
pdocker() { inns docker "$@"; }
# tool NAME ARGS...: the CLI inside the namespace on the private engine, in the background;
# its pid in $TOOL_PID, its output in $OUT/NAME.txt.
tool_bg() {
    local name=$1
    shift
    stamp "\$ sm120-stacks $*  ($name, in the background)"
    (cd "$WORK" && exec nsenter "--net=$NS" env DOCKER_HOST="$ENGINE" "$CLI" "${SUB[@]}" "$@") \
        >"$OUT/$name.txt" 2>&1 &
    TOOL_PID=$!
}
finish() {  # finish NAME: wait for $TOOL_PID, append its exit status
    local status=0
    wait "$TOOL_PID" || status=$?
    echo "[exit $status]" >>"$OUT/$1.txt"
    stamp "exit $status ($1): $(grep -E '^(error|failed|built|up to date|\[exit)' "$OUT/$1.txt" | head -1 | cut -c1-200)"
    return 0
}
tool() { tool_bg "$@"; finish "$1"; }
wait_until() {  # wait_until SECONDS WHAT CMD...: poll; false when it never held
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq $((seconds * 2))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        if ! kill -0 "$TOOL_PID" 2>/dev/null; then stamp "the tool ended before: $what"; return 1; fi
        sleep 0.5
    done
    stamp "timed out waiting for $what"
    return 1
}
restart_engine() {
    stamp "restart of the private engine ($*)"
    scripts/fleet-netns.sh restart-engine 1 "$@" 2>&1 | tee -a "$OUT/timeline.txt"
}
state() {  # state NAME: what the private engine and the workspace hold now
    {
        echo "## tags on the private engine"
        pdocker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' | grep -v '<none>' | sort
        echo "## containers (all)"
        pdocker ps -a --format '{{.Names}} {{.Status}} {{.Labels}}'
        echo "## records"
        for f in "$WORK"/build/*/records/*.json; do
            if [[ -f $f ]]; then echo "$f"; cat "$f"; fi
        done
        echo "## stray temporary files under build/"
        find "$WORK/build" -name '.*.json.*' -o -name '.*.yaml.*' | sed 's/^/  /'
    } >"$OUT/$1.state.txt" 2>&1 || true
}
registry_bg() {  # registry_bg NAME ADDR STORAGE [in-namespace]: a docker-registry of the bench
    local name=$1 addr=$2 storage=$3 where=${4:-}
    mkdir -p "$storage"
    printf 'version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' \
        "$storage" "$addr" >"$WORK/$name.yml"
    if [[ -n $where ]]; then
        setsid nsenter "--net=$NS" docker-registry serve "$WORK/$name.yml" >"$WORK/$name.log" 2>&1 </dev/null &
    else
        setsid docker-registry serve "$WORK/$name.yml" >"$WORK/$name.log" 2>&1 </dev/null &
    fi
    echo $! >"$WORK/$name.pid"
}
uploading() {  # uploading STORAGE: a layer upload under way holds some MB
    find "$1" -path '*/_uploads/*/data' -size +4M 2>/dev/null | grep -q .
}
published() {  # published STORAGE TAG: the registry has a manifest under TAG
    find "$1" -path "*/_manifests/tags/$2/current/link" 2>/dev/null | grep -q .
}
blobs() { find "$1" -path '*/blobs/sha256/*/data' 2>/dev/null | wc -l; }

fleet_up=0
nat_up=0
cleanup() {
    stamp "teardown"
    [[ $fleet_up == 1 ]] && scripts/fleet-netns.sh down >>"$OUT/teardown.txt" 2>&1
    if [[ $nat_up == 1 ]]; then
        iptables -t nat -D "${NAT_RULE[@]}" 2>/dev/null || true
        iptables -D FORWARD -s "$FLEET_SUBNET" -j ACCEPT 2>/dev/null || true
        iptables -D FORWARD -d "$FLEET_SUBNET" -j ACCEPT 2>/dev/null || true
    fi
    for name in r r2 r3; do
        [[ -f $WORK/$name.pid ]] && kill "$(cat "$WORK/$name.pid")" 2>/dev/null || true
    done
    mountpoint -q "$WORK/r3-disk" && umount -l "$WORK/r3-disk"
    # This machine's engine: only the tags this bench made, by name.
    docker images --format '{{.Repository}}:{{.Tag}}' |
        grep -E "^($R/|sm120-stacks:$STACK)" | xargs -r docker rmi >>"$OUT/teardown.txt" 2>&1 || true
    cat "$OUT/teardown.txt" 2>/dev/null | tail -3
    [[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT
: >"$OUT/timeline.txt"
: >"$OUT/teardown.txt"

stamp "run $RUN_ID, workspace $WORK, registry R $R (storage under the workspace)"
. bench/workspace.sh
bench_workspace "$WORK" "$VARIANT" $'extends: '"$STACK"$'\nbuild: {max_jobs: 1}\n'
cp stacks/ci-mini.yaml "$WORK/stacks/$STACK.yaml"
registry_bg r "$R" "$WORK/r"
sleep 2

stamp "0. this machine's engine: base and $STACK to R"
docker tag "$BASE" "$R/faults/cuda:13.0.2-devel-bookworm"
docker push -q "$R/faults/cuda:13.0.2-devel-bookworm" >"$OUT/0-push-base.txt" 2>&1
(cd "$WORK" && "$CLI" "${SUB[@]}" build "$STACK") >"$OUT/0-build-$STACK.txt" 2>&1
(cd "$WORK" && "$CLI" "${SUB[@]}" push "$STACK" --force --registry "$R/faults") >"$OUT/0-push-$STACK.txt" 2>&1
stamp "0. done: $(tail -1 "$OUT/0-push-$STACK.txt")"

stamp "the private engine (namespace $NS)"
scripts/fleet-netns.sh up 1 >"$WORK/fleet.env" 2>"$OUT/0-fleet-up.txt"
fleet_up=1
# The private engine's builds reach the package index as this machine's engine's do (through
# NAT, as docker0's containers do): the variant's jit-deps stage is not in R's inline cache
# (it keeps the final stage's layers only), and the 2026-12-02 re-run (6aa15e) failed there
# with "from versions: none". Taken out again at teardown; the registry stays on loopback.
FLEET_SUBNET="10.$SM120_FLEET_NET.1.0/24"
NAT_RULE=(POSTROUTING -s "$FLEET_SUBNET" ! -d "$FLEET_SUBNET" -j MASQUERADE)
sysctl -qw net.ipv4.ip_forward=1
iptables -t nat -C "${NAT_RULE[@]}" 2>/dev/null || iptables -t nat -A "${NAT_RULE[@]}"
iptables -C FORWARD -s "$FLEET_SUBNET" -j ACCEPT 2>/dev/null || iptables -I FORWARD -s "$FLEET_SUBNET" -j ACCEPT
iptables -C FORWARD -d "$FLEET_SUBNET" -j ACCEPT 2>/dev/null || iptables -I FORWARD -d "$FLEET_SUBNET" -j ACCEPT
nat_up=1

stamp "1. restart during the build's precompile step"
log_glob="$WORK/build/$VARIANT/logs/*.log"
in_precompile() { grep -q 'flashinfer_jit.py precompile' $log_glob; }
tool_bg 1-build-restarted build "$VARIANT" --cache-from-registry "$R/faults"
if wait_until 900 "the precompile step" in_precompile; then
    sleep 8
    restart_engine TERM
fi
finish 1-build-restarted
state 1-build-restarted
tool 1-build-again build "$VARIANT" --cache-from-registry "$R/faults"
cp $log_glob "$OUT/" 2>/dev/null || true
state 1-build-again
{
    echo "steps CACHED in the build again: $(grep -cE '^#[0-9]+ CACHED' "$WORK"/build/"$VARIANT"/logs/*-[0-9a-f]*.log)"
    echo "steps that ran in it:"
    log=$(ls "$WORK"/build/"$VARIANT"/logs/*.log | grep -v '\.1$' | head -1)
    for id in $(grep -E '^#[0-9]+ \[[a-z-]+ +[0-9]+/[0-9]+\]' "$log" | cut -d' ' -f1 | sort -u); do
        grep -qE "^$id CACHED" "$log" || echo "  $(grep -m1 -E "^$id \[" "$log" | cut -c1-140)"
    done
} >"$OUT/1-build-again.steps.txt"

stamp "2. restart during a push to an empty registry R2"
registry_bg r2 "$R2" "$WORK/r2" ns
sleep 2
tool_bg 2-push-restarted push "$VARIANT" --force --registry "$R2/faults"
if wait_until 300 "a layer upload to R2" uploading "$WORK/r2"; then
    restart_engine TERM
fi
finish 2-push-restarted
echo "blobs in R2 after the interrupted push: $(blobs "$WORK/r2")" >>"$OUT/2-push-restarted.txt"
state 2-push-restarted
tool 2-push-again push "$VARIANT" --force --registry "$R2/faults"
echo "blobs in R2 after the push again: $(blobs "$WORK/r2")" >>"$OUT/2-push-again.txt"
state 2-push-again

stamp "3. restart during test (the smoke's server up)"
smoke_up() { pdocker ps --filter label=sm120-stacks.smoke --format '{{.Names}}' | grep -q .; }
tool_bg 3-test-restarted test "$VARIANT" --volume "$MODEL:/models/tiny:ro"
if wait_until 600 "the smoke's container" smoke_up; then
    sleep 3
    restart_engine TERM
fi
finish 3-test-restarted
state 3-test-restarted
tool 3-test-again test "$VARIANT" --volume "$MODEL:/models/tiny:ro"
state 3-test-again

stamp "4. a push to R3, whose disk (a 256 MB tmpfs) fills"
mkdir -p "$WORK/r3-disk"
mount -t tmpfs -o size=256m tmpfs "$WORK/r3-disk"
registry_bg r3 "$R3" "$WORK/r3-disk/storage" ns
sleep 2
tool 4-push-disk-full push "$VARIANT" --force --registry "$R3/faults"
df -h "$WORK/r3-disk" >>"$OUT/4-push-disk-full.txt"
state 4-push-disk-full

stamp "5. docker system prune -af on the private engine during test"
checking() { pdocker ps --format '{{.Names}}' | grep -qE '^sm120-(check|smoke)-'; }
tool_bg 5-test-pruned test "$VARIANT" --volume "$MODEL:/models/tiny:ro"
if wait_until 300 "the test's first container" checking; then
    pdocker system prune -af >"$OUT/5-prune.txt" 2>&1
fi
finish 5-test-pruned
state 5-test-pruned
tool 5-test-after-prune test "$VARIANT" --volume "$MODEL:/models/tiny:ro"
tool 5-build-after-prune build "$VARIANT" --cache-from-registry "$R/faults"
tool 5-test-after-rebuild test "$VARIANT" --volume "$MODEL:/models/tiny:ro"
state 5-after-rebuild
stamp "done"
