#!/usr/bin/env bash
# A soak of the tool itself (`make bench-tool-soak`; bench/FAULTS.md "The tool's soak"): two
# loops at once, each from its own build folder, each LOOPS rounds at most and LIMIT_S seconds
# in all, of: change a ci-mini variant (an env value), build, test (the smoke on the tiny
# model), push (to this bench's own registry), pin, deploy and verify on a host of the namespace
# fleet (scripts/fleet-netns.sh: loop a deploys to host 1, loop b to host 2, over ssh).
# Afterwards every leak is counted, against what the records and pins name:
#
#   containers   this machine's engine: any made from a soak image; each host: any but its pin's
#   volumes      each host: any its pin does not name; this engine: any made by a soak container
#   networks     each host: any beyond the engine's own (bridge, host, none)
#   tags         this engine: soak tags beyond each record's content tag and the moving tag
#   registry     tags beyond the records' pushes and their evidence; upload sessions left open
#   build/       files of a content hash no record names; temporary files of a replaced write
#
# Each loop is also counted after every round of its own (`tool_soak_leaks.py --loop`, one row
# per round in leaks-rounds.tsv, round 0 before the first): containers, images, volumes,
# networks, temporary folders (each loop's commands run with TMPDIR=WORK/tmp/LOOP), build files,
# registry tags, repositories and open uploads, and the open files of its host engine and of the
# registry (not leaks, but they must stay flat).
#
# FAIL_AT=LOOP:ROUND:STEP[,...] makes that step fail, as a user's would: `push` to a registry
# that is not there (127.0.0.1:9), `test` with an empty model folder (the server cannot load). The loop counts that
# round's leaks and goes on with the next round (a failure not asked for still ends the loop).
# LIMIT_S is looked at before each round: the round under way when it passes runs to its end
# (loop-*.txt says how far past the limit).
#
# The loop fails (exit 1) on any leak or any failed step. Raw logs: bench/results/tool-soak/.
set -euo pipefail
cd "$(dirname "$0")/.."

LOOPS=${LOOPS:-3}
LIMIT_S=${LIMIT_S:-1500}
FAIL_AT=${FAIL_AT:-}
RUN_ID=${RUN_ID:-$(head -c3 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export SM120_FLEET_NAME=sm120-soak SM120_FLEET_NET=${SM120_FLEET_NET:-233}
NET=10.$SM120_FLEET_NET
WORK=${WORK:-$(mktemp -d /tmp/sm120-tool-soak.XXXXXX)}
OUT=${OUT:-$PWD/bench/results/tool-soak}
CLI=$PWD/.venv/bin/sm120-stacks
PY=$PWD/.venv/bin/python
MODEL=$PWD/build/tiny-model
mkdir -p "$OUT"
SECONDS=0
R_PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
R=127.0.0.1:$R_PORT
export SM120_FLEET_REGISTRY_PORT=$R_PORT

stamp() { printf '[%4ds] %s\n' "$SECONDS" "$*" | tee -a "$OUT/timeline.txt"; }

fleet_up=0
cleanup() {
    stamp "teardown"
    [[ $fleet_up == 1 && ${KEEP:-0} != 1 ]] && scripts/fleet-netns.sh down >>"$OUT/teardown.txt" 2>&1
    [[ -f $WORK/registry.pid ]] && kill "$(cat "$WORK/registry.pid")" 2>/dev/null || true
    # This machine's engine: only the soak's own tags, by name (never a prune).
    docker images --format '{{.Repository}}:{{.Tag}}' | grep -E "^(sm120-stacks:soak-[ab]-$RUN_ID|$R/)" |
        xargs -r docker rmi >>"$OUT/teardown.txt" 2>&1 || true
    [[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT
: >"$OUT/timeline.txt"
: >"$OUT/teardown.txt"

stamp "run $RUN_ID: $LOOPS rounds per loop at most, $LIMIT_S s; registry $R; workspace $WORK${FAIL_AT:+; failures asked: $FAIL_AT}"
"$PY" bench/tool_soak_leaks.py --header - - - >"$OUT/leaks-rounds.tsv"
mkdir -p "$WORK/registry"
printf 'version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n' \
    "$WORK/registry" "$R" >"$WORK/registry.yml"
setsid docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 </dev/null &
echo $! >"$WORK/registry.pid"
scripts/fleet-netns.sh up 2 >"$WORK/fleet.env" 2>"$OUT/fleet-up.txt"
fleet_up=1
# shellcheck disable=SC1091
. "$WORK/fleet.env"

. bench/workspace.sh
loop() {  # loop a|b HOST_INDEX: the rounds of one build folder, each step's output kept
    local id=$1 index=$2 round=0 status=0 began_round failed_step model registry
    local root=$WORK/$id stack=soak-$1-$RUN_ID host=soak-$1-$RUN_ID-host
    local log=$OUT/loop-$id.txt tmp=$WORK/tmp/$id
    bench_workspace "$root" "$stack" $'extends: ci-mini\nenv: {SOAK_ROUND: "0"}\n'
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$root/api-key"  # the server's key
    mkdir -p "$tmp"
    : >"$log"
    step() {  # step NAME ARGS...: one command of the round; false when it failed
        local name=$1 began=$SECONDS code=0
        shift
        (cd "$root" && TMPDIR=$tmp "$CLI" "$@") >"$OUT/$id-$round-$name.txt" 2>&1 || code=$?
        printf '[%4ds] %s round %s %-7s exit %s (%ds)\n' "$SECONDS" "$id" "$round" "$name" \
            "$code" $((SECONDS - began)) | tee -a "$log"
        ((code == 0)) || failed_step=$name
        return "$code"
    }
    asked() { [[ ,$FAIL_AT, == *",$id:$round:$1,"* ]]; }  # asked STEP: a failure asked here
    count() {  # the loop's leaks after its round
        "$PY" bench/tool_soak_leaks.py "$WORK" "$R" "$RUN_ID" --loop "$id" --round "$round" \
            --tsv "$OUT/leaks-rounds.tsv" >"$OUT/$id-$round-leaks.txt" 2>&1 || true
        printf '[%4ds] %s round %s leaks   %s\n' "$SECONDS" "$id" "$round" \
            "$(grep -E '^leaks in all' "$OUT/$id-$round-leaks.txt" || tail -1 "$OUT/$id-$round-leaks.txt")" |
            tee -a "$log"
    }
    count  # round 0: before the first
    for round in $(seq "$LOOPS"); do
        if ((SECONDS > LIMIT_S)); then
            echo "time limit ($LIMIT_S s) passed at ${SECONDS} s: round $round and later not run" >>"$log"
            break
        fi
        began_round=$SECONDS failed_step=
        model=$MODEL registry=$R/soak-$id
        if asked test; then model=$WORK/empty-model && mkdir -p "$model"; fi
        if asked push; then registry=127.0.0.1:9/soak-$id; fi
        printf 'extends: ci-mini\nenv: {SOAK_ROUND: "%s"}\n' "$round" >"$root/stacks/$stack.yaml"
        step build build "$stack" &&
            step test test "$stack" --volume "$model:/models/tiny:ro" &&
            step push push "$stack" --registry "$registry" &&
            step pin pin "$host" "$stack" --engine "ssh://root@$NET.$index.2" --gpus none \
                --port 8000:8000 --api-key-file "$root/api-key" --volume "$MODEL:/models/tiny:ro" \
                --registry "$R/soak-$id" &&
            step deploy deploy "$host" --apply &&
            step verify verify "$host" || true
        if ((began_round <= LIMIT_S && SECONDS > LIMIT_S)); then
            echo "time limit ($LIMIT_S s) passed during round $round: it ended $((SECONDS - LIMIT_S)) s past it" >>"$log"
        fi
        count
        if [[ -n $failed_step ]]; then
            if asked "$failed_step"; then
                echo "round $round: $failed_step failed as asked (FAIL_AT); the next round goes on" >>"$log"
            else
                status=1
                break
            fi
        fi
    done
    echo "loop $id: exit $status" >>"$log"
    return "$status"
}

stamp "two loops at once"
loop a 1 & pid_a=$!
loop b 2 & pid_b=$!
failed=0
wait "$pid_a" || failed=1
wait "$pid_b" || failed=1
cat "$OUT/loop-a.txt" "$OUT/loop-b.txt" | tee -a "$OUT/timeline.txt"

stamp "leaks"
"$PY" bench/tool_soak_leaks.py "$WORK" "$R" "$RUN_ID" >"$OUT/leaks.txt" 2>&1 || failed=1
cat "$OUT/leaks.txt"
stamp "exit $failed"
exit "$failed"
