# Sourced by the benchmarks that run the tool on a scratch copy of ci-mini (fleet.sh,
# shared-cache.sh): a workspace WORK with stacks/ci-mini.yaml as committed and one variant
# manifest, the fetched wheels and the patches linked in, so the tool resolves there as here.
#
#   bench_workspace WORK VARIANT_NAME VARIANT_YAML

# The benches' registries (loopback, the namespace hosts') speak plain HTTP: named insecure,
# as a user names theirs (docs/evidence.md, "Your own registry").
export SM120_STACKS_INSECURE_REGISTRIES=${SM120_STACKS_INSECURE_REGISTRIES:-127.0.0.0/8,10.0.0.0/8}
bench_workspace() {
  local work=$1 name=$2 yaml=$3
  mkdir -p "$work/stacks" "$work/build"
  cp stacks/ci-mini.yaml "$work/stacks/"
  printf '%s' "$yaml" >"$work/stacks/$name.yaml"
  ln -sfn "$PWD/build/wheels" "$work/build/wheels"
  ln -sfn "$PWD/patches" "$work/patches"
}

# Steps of a bench, each logged with its time into $OUT/timeline.txt (SECONDS since the start)
# and its output into $OUT/NAME.txt, run in $WORK: the raw output every figure names.
#   run NAME CMD...   its status returned     must NAME CMD...  the bench stops when it fails
#   may NAME CMD...   a failure is measured   expect NAME TEXT  the step's output says TEXT
stamp() { printf '[%4ds] %s\n' "$SECONDS" "$*" | tee -a "$OUT/timeline.txt"; }
run() {
    local name=$1 status=0
    shift
    stamp "\$ ${*/#$CLI/sm120-stacks}"
    (cd "$WORK" && "$@") >"$OUT/$name.txt" 2>&1 || status=$?
    cat "$OUT/$name.txt"
    stamp "exit $status ($name)"
    return "$status"
}
must() { run "$@" || { stamp "FAILED: $1"; exit 1; }; }
may() { run "$@" || true; }
expect() {
    grep -qF -- "$2" "$OUT/$1.txt" || { stamp "FAILED: $1 does not say '$2'"; exit 1; }
}

# The no-op, 5 pairs (issue 46): `build STACK` with nothing to do against BuildKit's own no-op of
# the same context, the replay script COMMAND_SH the build wrote; into $OUT/noop-pairs.txt.
noop_pairs() {
    local stack=$1 command_sh=$2 i
    for i in 1 2 3 4 5; do
        (cd "$WORK" && /usr/bin/time -f "tool wall %e s cpu %U+%S s" "$CLI" build "$stack" \
            >/dev/null) 2>>"$OUT/noop-pairs.txt"
        (cd "$WORK" && /usr/bin/time -f "buildkit wall %e s cpu %U+%S s" sh "$command_sh" \
            >/dev/null 2>"$OUT/noop-buildkit-$i.log"; tail -n 1 "$OUT/noop-buildkit-$i.log") \
            >>"$OUT/noop-pairs.txt"
    done
    cat "$OUT/noop-pairs.txt"
}
