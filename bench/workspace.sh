# Sourced by the benchmarks that run the tool on a scratch copy of ci-mini (fleet.sh,
# shared-cache.sh): a workspace WORK with stacks/ci-mini.yaml as committed and one variant
# manifest, the fetched wheels and the patches linked in, so the tool resolves there as here.
#
#   bench_workspace WORK VARIANT_NAME VARIANT_YAML
bench_workspace() {
  local work=$1 name=$2 yaml=$3
  mkdir -p "$work/stacks" "$work/build"
  cp stacks/ci-mini.yaml "$work/stacks/"
  printf '%s' "$yaml" >"$work/stacks/$name.yaml"
  ln -sfn "$PWD/build/wheels" "$work/build/wheels"
  ln -sfn "$PWD/patches" "$work/patches"
}
