#!/usr/bin/env bash
# Hits per second through the Redis backend at 1, 16, 64 and 256 in flight,
# against a redis-server this script starts on a free port of 127.0.0.1, in the
# same run as (a) the naive INCR + PEXPIRE in two round trips and (b) the
# ceiling: redis-benchmark running EVALSHA of the same script at the same
# concurrency, both as C connections (-c C) and as one connection with C
# commands pipelined (-c 1 -P C), which is how the backend's one multiplexed
# connection carries C hits in flight. The ratio is to the higher of the two.
# Then the deny cache: Redis commands spent on denied hits.
#
#   bash bench/redis.sh                 # 5 s per case
#   SECONDS_PER_CASE=10 bash bench/redis.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in redis-server redis-cli redis-benchmark python3; do
  command -v "$bin" >/dev/null || { echo "$bin not found (apt-get install redis-server redis-tools)" >&2; exit 1; }
done
SECS=${SECONDS_PER_CASE:-5}

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --logfile "$dir/log" --daemonize yes --pidfile "$dir/pid"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
url="redis://127.0.0.1:$port/"

cargo build --release -p tower-pinned-window-bench --bin redis_bench --quiet
bench=target/release/redis_bench
# The backend's script, exactly as the crate holds it.
script_text=$("$bench" script)
sha=$(redis-cli -p "$port" SCRIPT LOAD "$script_text")
[ ${#sha} -eq 40 ] || { echo "could not load the script: $sha" >&2; exit 1; }

rps() { # redis-benchmark's requests per second for EVALSHA with the given connection flags
  redis-cli -p "$port" flushall >/dev/null
  redis-benchmark -p "$port" "$@" -r 100000000 --csv EVALSHA "$sha" 1 "bench:ceiling:b:__rand_int__" 60000 |
    tail -n 1 | cut -d, -f2 | tr -d '"'
}

printf '%9s  %13s  %12s  %13s  %13s  %14s  %12s\n' in_flight pinned_hits/s naive_hits/s ceiling_-c/s ceiling_-P/s pinned/ceiling pinned/naive
for c in 1 16 64 256; do
  redis-cli -p "$port" flushall >/dev/null
  pinned=$("$bench" "$url" pinned "$c" "$SECS")
  redis-cli -p "$port" flushall >/dev/null
  naive=$("$bench" "$url" naive "$c" "$SECS")
  n=$(python3 -c "print(max(20000, int($pinned * $SECS)))")
  ceil_c=$(rps -c "$c" -n "$n")
  ceil_p=$(rps -c 1 -P "$c" -n "$n")
  printf '%9s  %13.0f  %12.0f  %13.0f  %13.0f  %14.2f  %12.2f\n' "$c" "$pinned" "$naive" "$ceil_c" "$ceil_p" \
    "$(python3 -c "print($pinned / max($ceil_c, $ceil_p))")" "$(python3 -c "print($pinned / $naive)")"
done

calls() { redis-cli -p "$port" info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_(evalsha|eval):/ {n += $3} END {print n + 0}'; }
redis-cli -p "$port" config resetstat >/dev/null
before=$(calls)
denied=$("$bench" "$url" denied 64 "$SECS")
after=$(calls)
echo
echo "deny cache: $denied denied hits/s at 64 in flight; EVAL/EVALSHA calls in that run: $((after - before)), of which 2 put the key over its limit"
