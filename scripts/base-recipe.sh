# shellcheck shell=bash
# Sourced by the base scripts (make-base-local.sh, make-base-cuda-local.sh): bases made once,
# whoever asks, and named by what they are made of (issue 46).
#
#   base_lock NAME IMAGE      one run per IMAGE on this machine: a second waits for the first
#                             (flock; the kernel drops the lock when its holder dies)
#   recipe_hash FILE... -- WORD...   sha256 of the files' names and bytes and the words
#   content_tag REF ID        REF's repository, tagged TAG-id-<ID's 64 hex>: the tag the tool
#                             builds FROM (builder/render/bases.py), made here for a base's base
#   recipe_image TAG RECIPE   the image ID under TAG when its recipe label says RECIPE, else ""
#   publish NAME IMAGE RECIPE_TAG   point IMAGE at RECIPE_TAG's image, saying so when it moves
RECIPE_LABEL=sm120-stacks.base-recipe

base_lock() {
  local name=$1 image=$2 dir="${SM120_STACKS_LOCK_DIR:-/tmp}" file
  file="$dir/sm120-stacks-base.$(printf '%s' "$image" | tr -c 'A-Za-z0-9._-' '_').lock"
  # Another user's run may have made the file: opened for reading, a shared one still locks.
  [[ -e "$file" ]] || { (umask 000 && : >"$file") 2>/dev/null || true; }
  exec 9<"$file"
  if ! flock -n 9; then
    echo "$name: another run is making $image (it holds $file); waiting for it to finish"
    flock 9
  fi
}

recipe_hash() {
  local files=() words=()
  while (($#)) && [[ "$1" != -- ]]; do files+=("$1"); shift; done
  (($#)) && shift
  words=("$@")
  {
    for f in "${files[@]}"; do printf 'file %s\n' "$(basename "$f")"; sha256sum <"$f"; done
    for w in "${words[@]}"; do printf 'word %s\n' "$w"; done
  } | sha256sum | cut -c1-64
}

content_tag() {
  local ref=$1 id=${2#sha256:} repo tag last
  last=${ref##*/}
  if [[ "$last" == *:* ]]; then repo=${ref%:*} tag=${ref##*:}; else repo=$ref tag=latest; fi
  printf '%s:%s-id-%s\n' "$repo" "${tag:0:60}" "$id"
}

recipe_image() {
  local tag=$1 recipe=$2 got
  got="$("$DOCKER" image inspect --format "{{.Id}} {{index .Config.Labels \"$RECIPE_LABEL\"}}" \
    "$tag" 2>/dev/null || true)"
  if [[ -n "$got" && "${got#* }" == "$recipe" ]]; then printf '%s\n' "${got%% *}"; fi
  if [[ -n "$got" && "${got#* }" != "$recipe" ]]; then
    echo "${SCRIPT_NAME:-base}: $tag names recipe ${recipe:0:16} but its image was made by" \
      "'${got#* }'; making it again" >&2
  fi
}

publish() {
  local name=$1 image=$2 recipe_tag=$3 old new
  old="$("$DOCKER" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
  new="$("$DOCKER" image inspect --format '{{.Id}}' "$recipe_tag")"
  "$DOCKER" tag "$recipe_tag" "$image"
  if [[ -n "$old" && "$old" != "$new" ]]; then
    echo "$name: $image moved from ${old:7:12} to ${new:7:12} (FORCE=1). Images built on" \
      "${old:7:12} keep it: builds name their base by content ($(content_tag "$image" "$old"));" \
      "a stack built again now builds on ${new:7:12}"
  fi
}
