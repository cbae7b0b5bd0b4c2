#!/usr/bin/env bash
# The public API of a crate of the workspace, all features on, one item a
# line, compared with its checked-in public-api.txt. A change to the surface
# then shows in review as a change to that file.
#
#   .ci/public-api.sh [CRATE]           check: fails with a diff when the API moved
#   .ci/public-api.sh --bless [CRATE]   write the public-api.txt from the current source
#   .ci/public-api.sh --count [CRATE]   count the public-api.txt's types and functions
#   .ci/public-api.sh --all [--bless | --count]   every crate in turn
#
# CRATE: `core` (tower-pinned-window, public-api.txt at the root; the
# default), `redis` (tower-pinned-window-redis, redis/public-api.txt) or
# `postgres` (tower-pinned-window-postgres, postgres/public-api.txt).
#
# How: rustdoc writes JSON (an unstable output format, so on this stable
# toolchain it needs RUSTC_BOOTSTRAP=1, as the docs.rs-style doc build in
# .ci/run does), and tools/public-api (a workspace member that depends on the
# `public-api` library, so it shares the build cache) renders it.
#
# RUSTC_BOOTSTRAP=1 is set for every cargo command here, the tool's build
# too: proc-macro2's build script reads it, and a build without it between two
# with it would re-check every dependency (minutes, not seconds).
set -euo pipefail
export RUSTC_BOOTSTRAP=1
cd "$(dirname "$0")/.."

# Types: structs, enums, unions, traits and type aliases (not associated
# types). Functions: free functions, inherent methods and the methods traits
# declare, each path once (trait impls' methods, such as `clone`, are not
# counted; a method listed under two paths is counted once).
count() {
  python3 - "$1" <<'PY'
import re, sys
types, fns, ctx = {}, set(), None
for line in open(sys.argv[1]).read().splitlines():
    item = re.sub(r"^(#\[[^\]]*\]\s*)+", "", line)
    name = re.match(r"pub (?:const |async |unsafe )*(\w+) ((?:[^\s<(:]|::)+)", item)
    kind = name.group(1) if name else None
    if kind in ("struct", "enum", "union", "trait") or (kind == "type" and ctx is None):
        types[name.group(2)] = kind
        ctx = "trait" if kind == "trait" else None
    elif item.startswith("impl"):
        ctx = "trait impl" if " for " in item else "inherent"
    elif kind in ("mod", "use"):
        ctx = None
    elif kind == "fn" and ctx != "trait impl":
        fns.add(name.group(2))
kinds = {k: sum(1 for v in types.values() if v == k) for k in sorted(set(types.values()))}
print(f"public types: {len(types)} ({', '.join(f'{n} {k}' for k, n in kinds.items())})")
print(f"public functions and methods: {len(fns)}")
PY
}

bless=false mode=check crate=core all=false
for arg in "$@"; do
  case "$arg" in
    --bless) bless=true ;;
    --count) mode=count ;;
    --all) all=true ;;
    core | redis | postgres) crate=$arg ;;
    *) echo "usage: $0 [--bless | --count] [core | redis | postgres] | --all [--bless | --count]" >&2; exit 2 ;;
  esac
done
if $all; then
  flags=()
  $bless && flags+=(--bless)
  [ "$mode" = count ] && flags+=(--count)
  for c in core redis postgres; do "$0" ${flags[@]+"${flags[@]}"} "$c"; done
  exit 0
fi
case "$crate" in
  core) package=tower-pinned-window file=public-api.txt ;;
  *) package=tower-pinned-window-$crate file=$crate/public-api.txt ;;
esac
if [ "$mode" = count ]; then
  echo "$package ($file):"
  count "$file"
  exit 0
fi

target=${CARGO_TARGET_DIR:-target}
json=$target/doc/${package//-/_}.json
rm -f "$json"
cargo rustdoc --quiet --lib -p "$package" --all-features \
  -- -Z unstable-options --output-format json
cargo build --quiet -p tower-pinned-window-public-api
listing=$(mktemp)
trap 'rm -f "$listing"' EXIT
"$target/debug/tower-pinned-window-public-api" "$json" >"$listing"

if $bless; then
  cp "$listing" "$file"
  echo "$file: $(wc -l <"$file") items written"
  exit 0
fi
if ! diff -u --label "$file (checked in)" --label 'public API (this source)' \
  "$file" "$listing"; then
  echo >&2
  echo "The public API of $package differs from $file (above: - removed, + added)." >&2
  echo "If the change is meant, run .ci/public-api.sh --bless $crate and commit $file." >&2
  exit 1
fi
echo "public API of $package matches $file ($(wc -l <"$file") items)"
