#!/usr/bin/env bash
# Redis' instructions per hit under valgrind's callgrind: a redis-server
# started under callgrind on a free port of 127.0.0.1, driven by
# `redis_bench` at 64 in flight, and the instructions Redis spent running the
# backend's scripts (inclusive of `evalGenericCommand`: EVAL and EVALSHA)
# divided by the hits. Coalesced hits (the default) and one EVALSHA per hit,
# over 10,000 keys and on one hot key; MODES picks other modes of
# redis_bench, such as `pinned` (every hit a new key).
#
#   bash bench/redis_callgrind.sh
#   SECONDS_PER_CASE=8 bash bench/redis_callgrind.sh
#   MODES="keys pinned" bash bench/redis_callgrind.sh
#   REDIS_BENCH=/path/to/redis_bench bash bench/redis_callgrind.sh   # another build, for a before/after
#   IN_FLIGHT=1 MODES=spend-keys bash bench/redis_callgrind.sh        # one request a call (default 64 in flight)
#
# Under valgrind Redis runs many times slower, so calls carry more hits than
# in bench/redis.sh; the per-key work of a call (what the script spends on
# each distinct counter) is what these figures are for. Over 10,000 keys
# they repeat to within about 1% from run to run (the first hit on each key
# creates it, so a run with fewer hits has more creations in its average);
# on the hot key a call's size, and so its count, varies more.
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in valgrind callgrind_annotate redis-server redis-cli python3; do
  command -v "$bin" >/dev/null || { echo "$bin not found (apt-get install valgrind redis-server redis-tools)" >&2; exit 1; }
done
SECS=${SECONDS_PER_CASE:-8}

if [ -n "${REDIS_BENCH:-}" ]; then
  bench=$REDIS_BENCH
else
  cargo build --release -p tower-pinned-window-bench --bin redis_bench --quiet
  bench="${CARGO_TARGET_DIR:-target}"/release/redis_bench
fi

one() { # $1 = mode: prints instructions per hit
  local dir port vg out hits ir
  dir=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    >"$dir/log" 2>&1 &
  vg=$!
  for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  out=$("$bench" "redis://127.0.0.1:$port/" "$1" "${IN_FLIGHT:-64}" "$SECS")
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$vg" || true
  hits=$(awk '{print $2}' <<<"$out")
  ir=$(callgrind_annotate --inclusive=yes "$dir/callgrind.out" 2>/dev/null |
    grep -E ':evalGenericCommand ' | head -n 1 | awk '{gsub(",", "", $1); print $1}')
  rm -rf "$dir"
  [ -n "$ir" ] && [ "${hits:-0}" -gt 0 ] || { echo "no count for $1" >&2; exit 1; }
  python3 -c "print('%-12s %10d %12.0f' % ('$1', $hits, $ir / $hits))"
}

printf '%-12s %10s %12s\n' mode hits redis_ir/hit
for mode in ${MODES:-keys keys-single hot hot-single}; do one "$mode"; done
