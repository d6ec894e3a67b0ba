#!/usr/bin/env bash
# The fleet, for real (bench/RESULTS.md, "Fleet"; `make bench-fleet`): two serving hosts, each a
# network namespace with its own sshd and dockerd (scripts/fleet-netns.sh), pinned with
# `engine: ssh://root@10.231.I.2` and reached over ssh with a key held only by an agent.
#
#  1. ci-mini and a variant of it (v2: another env value) built here, pushed to the registry
#     (--force: the images are the ones `make stack` tests; their records are marked tested);
#  2. both hosts pinned to ci-mini; `deploy --all --apply` pulls it onto each engine over the
#     namespace network and gates each host on /health and the smoke through its URL;
#  3. drift on host 1 (its container stopped behind the pin's back): `verify --all` names it;
#  4. both pinned to v2, host 2 with a model that answers wrong (the failure): the roll
#     deploys host 1, fails host 2's smoke and puts host 2 back on its previous pin;
#  5. `verify --all` again; both servers asked.
# The namespaces and engines are torn down at the end and the main engine checked.
set -euo pipefail
cd "$(dirname "$0")/.."

REGISTRY=${REGISTRY:-127.0.0.1:5000}
NAMESPACE=sm120-fleet-bench
BASE=local/cuda:13.0.2-devel-bookworm
# The base under the same name as bench/shared-cache.sh pushes it: the FROM line (and so the
# FlashInfer step's cache mount id) stays the same, and ci-mini built there is up to date here.
PUSHED_BASE=$REGISTRY/sm120-cache-bench/cuda:13.0.2-devel-bookworm
WORK=${WORK:-$(mktemp -d /tmp/sm120-fleet-bench.XXXXXX)}
OUT=${OUT:-$PWD/bench/results/fleet}
CLI=$PWD/.venv/bin/sm120-stacks
PY=$PWD/.venv/bin/python
mkdir -p "$OUT"
SECONDS=0

# stamp, run, must, may: bench/workspace.sh (sourced below, before the first step)

started=0
cleanup() {
    if [[ $started == 1 && ${KEEP:-0} != 1 ]]; then
        scripts/fleet-netns.sh down 2>&1 | tee "$OUT/teardown.txt"
    fi
    docker rmi "$PUSHED_BASE" >/dev/null 2>&1 || true
}
trap cleanup EXIT
: >"$OUT/timeline.txt"

. bench/workspace.sh
stamp "workspace $WORK"
bench_workspace "$WORK" ci-mini-v2 $'extends: ci-mini\nenv:\n  OMP_NUM_THREADS: "1"\n'
mkdir -p "$WORK/models"
SUB=(--substitute-base "$BASE=$PUSHED_BASE")

stamp "models: one that answers right, one fluent and wrong"
"$PY" - "$WORK/models" <<'EOF'
import sys
from pathlib import Path
from tests.support.tinymodel import make_tiny_model
q = "What is the capital of Kentucky?"
root = Path(sys.argv[1])
make_tiny_model(root / "right" / "tiny", [(q, "The capital of Kentucky is Frankfort.")])
make_tiny_model(root / "wrong" / "tiny", [(q, "The capital of Kentucky is Louisville.")])
EOF

stamp "1. images built here and pushed"
docker tag "$BASE" "$PUSHED_BASE"
docker push -q "$PUSHED_BASE" >/dev/null
for stack in ci-mini ci-mini-v2; do
    must "build-$stack" "$CLI" "${SUB[@]}" build "$stack"
    "$PY" - "$WORK" "$stack" "${SUB[@]}" <<'EOF'
import sys
from pathlib import Path
from builder.image.records import load_record, save_record
from builder.render.context import render
from builder.manifest.resolve import resolve
from builder.manifest.substitute import Substitutions
work, stack, sub = Path(sys.argv[1]), sys.argv[2], Substitutions.parse([sys.argv[4]])
content_hash = render(resolve(stack, work / "stacks", sub)).content_hash()
record = load_record(work / "build", stack, content_hash)
record.tests = "passed"  # what `sm120-stacks test` records; ci-mini's tests run in make test
save_record(work / "build", record)
EOF
    must "push-$stack" "$CLI" "${SUB[@]}" push "$stack" --registry "$REGISTRY/$NAMESPACE"
done

stamp "2. two hosts"
scripts/fleet-netns.sh up 2 >"$WORK/fleet.env"
started=1
# shellcheck disable=SC1091
. "$WORK/fleet.env"
# The serve port is published beyond loopback (this machine asks it over the namespace link),
# so the servers want a key (pin refuses otherwise): one file, read by the server on the host
# (the namespaces share this machine's disk) and by the deploy's smoke here.
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/api-key"
pin() {  # pin HOST STACK MODELS
    must "pin-$1-$2" "$CLI" "${SUB[@]}" pin "$1" "$2" --engine "ssh://root@10.231.${1#fleet-h}.2" \
        --gpus none --port 8000:8000 --api-key-file "$WORK/api-key" \
        --volume "$WORK/models/$3:/models:ro" --registry "$REGISTRY/$NAMESPACE"
}
pin fleet-h1 ci-mini right
pin fleet-h2 ci-mini right
must deploy-1 "$CLI" "${SUB[@]}" deploy --all --apply
must verify-1 "$CLI" "${SUB[@]}" verify --all

stamp "3. drift on host 1: its container stopped behind the pin's back"
DOCKER_HOST=ssh://root@10.231.1.2 docker stop -t 5 sm120-stacks-fleet-h1 >/dev/null
may verify-2-drift "$CLI" "${SUB[@]}" verify --all

stamp "4. both pinned to v2; host 2 gets a model that answers wrong"
pin fleet-h1 ci-mini-v2 right
pin fleet-h2 ci-mini-v2 wrong
may deploy-2-failure "$CLI" "${SUB[@]}" deploy --all --apply
may verify-3-after-rollback "$CLI" "${SUB[@]}" verify --all

stamp "5. what each host serves now"
for i in 1 2; do
    answer=$(curl -s -m 60 "http://10.231.$i.2:8000/v1/chat/completions" \
        -H 'content-type: application/json' -H "authorization: Bearer $(cat "$WORK/api-key")" \
        -d '{"model": "/models/tiny", "messages": [{"role": "user", "content": "What is the capital of Kentucky?"}], "max_tokens": 20, "temperature": 0}' |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' || echo "(no answer)")
    env=$(DOCKER_HOST=ssh://root@10.231.$i.2 docker inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "sm120-stacks-fleet-h$i" | grep OMP_NUM_THREADS || true)
    stamp "host $i answers: $answer ($env)"
done
stamp "done"
