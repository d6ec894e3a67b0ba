# Sourced by the H200 bundle scripts (prepare_h200_bundle.sh, prepare_h200_vllm033.sh): the
# cp312 x86_64 wheels of a requirements file, for the GPU machine's Python, whatever this
# machine's own Python is.
#
#   h200_wheels REQUIREMENTS DEST
h200_wheels() {
  local platforms=()
  for n in 39 35 34 31 28 27 24 17 5; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform linux_x86_64 --platform any \
    -d "$2" -r "$1"
}
