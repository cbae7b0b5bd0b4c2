#!/usr/bin/env bash
# The public API of tower-pinned-window, all features on, one item a line,
# compared with the checked-in public-api.txt. A change to the surface then
# shows in review as a change to that file.
#
#   .ci/public-api.sh           check: fails with a diff when the API moved
#   .ci/public-api.sh --bless   write public-api.txt from the current source
#   .ci/public-api.sh --count   count public-api.txt's types and functions
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

bless=false
case "${1:-}" in
  '') ;;
  --bless) bless=true ;;
  --count) count public-api.txt; exit 0 ;;
  *) echo "usage: $0 [--bless | --count]" >&2; exit 2 ;;
esac

target=${CARGO_TARGET_DIR:-target}
json=$target/doc/tower_pinned_window.json
rm -f "$json"
cargo rustdoc --quiet --lib -p tower-pinned-window --all-features \
  -- -Z unstable-options --output-format json
cargo build --quiet -p tower-pinned-window-public-api
listing=$(mktemp)
trap 'rm -f "$listing"' EXIT
"$target/debug/tower-pinned-window-public-api" "$json" >"$listing"

if $bless; then
  cp "$listing" public-api.txt
  echo "public-api.txt: $(wc -l <public-api.txt) items written"
  exit 0
fi
if ! diff -u --label 'public-api.txt (checked in)' --label 'public API (this source)' \
  public-api.txt "$listing"; then
  echo >&2
  echo "The public API differs from public-api.txt (above: - removed, + added)." >&2
  echo "If the change is meant, run .ci/public-api.sh --bless and commit public-api.txt." >&2
  exit 1
fi
echo "public API matches public-api.txt ($(wc -l <public-api.txt) items)"
