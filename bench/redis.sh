#!/usr/bin/env bash
# First, coalesced hits (the default) against one EVALSHA per hit
# (`.coalesce(false)`), in the same run, ROUNDS times each way, alternating:
# hits/s at 64 in flight over 10,000 distinct keys and on one hot key, and at
# 1 in flight (latency), with what each hit costs: Redis commands (INFO
# commandstats: script calls, and every command including those the script
# runs), Redis server CPU (INFO cpu) and the benchmark process's CPU.
#
# Then (CEILING=0 skips it) hits per second through the Redis backend at 1, 16, 64 and 256 in flight,
# against a redis-server this script starts on a free port of 127.0.0.1, in the
# same run as (a) the naive INCR + PEXPIRE in two round trips and (b) the
# ceiling: redis-benchmark running EVALSHA of the same script at the same
# concurrency, both as C connections (-c C) and as one connection with C
# commands pipelined (-c 1 -P C), which is how the backend's one multiplexed
# connection carries C hits in flight. The ratio is to the higher of the two.
# Then the deny cache: Redis commands spent on denied hits.
#
#   bash bench/redis.sh                 # 5 s per case
#   SECONDS_PER_CASE=10 ROUNDS=3 CEILING=0 bash bench/redis.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in redis-server redis-cli redis-benchmark python3; do
  command -v "$bin" >/dev/null || { echo "$bin not found (apt-get install redis-server redis-tools)" >&2; exit 1; }
done
SECS=${SECONDS_PER_CASE:-5}
ROUNDS=${ROUNDS:-2}
CEILING=${CEILING:-1}

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --logfile "$dir/log" --daemonize yes --pidfile "$dir/pid"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
url="redis://127.0.0.1:$port/"

# REDIS_BENCH=/path/to/redis_bench measures another build (a before/after).
if [ -n "${REDIS_BENCH:-}" ]; then
  bench=$REDIS_BENCH
else
  cargo build --release -p tower-pinned-window-bench --bin redis_bench --quiet
  bench="${CARGO_TARGET_DIR:-target}"/release/redis_bench
fi

stat() { # the sum of a field over INFO's lines matching a pattern
  redis-cli -p "$port" info "$1" | tr -d '\r' | awk -F'[=,:]' -v pat="$2" -v field="$3" '$0 ~ pat {n += $field} END {printf "%.6f\n", n + 0}'
}
measure() { # $1 = mode, $2 = in flight: one row of the coalescing table
  redis-cli -p "$port" flushall >/dev/null
  redis-cli -p "$port" config resetstat >/dev/null
  local cpu0 cpu1 rate total client scripts all
  cpu0=$(stat cpu '^used_cpu_(sys|user):' 2)
  read -r rate total client < <("$bench" "$url" "$1" "$2" "$SECS")
  cpu1=$(stat cpu '^used_cpu_(sys|user):' 2)
  scripts=$(stat commandstats '^cmdstat_(evalsha|eval):' 3)
  all=$(stat commandstats '^cmdstat_' 3)
  # INFO itself and CONFIG RESETSTAT are counted too: a handful, over many hits.
  python3 -c "
r, t = $rate, max($total, 1)
print('%-14s %9s %10.0f %10.1f %12.3f %12.2f %12.2f %12.2f' % ('$1', '$2', r, 1e6 / r * $2, $scripts / t, $all / t, ($cpu1 - $cpu0) * 1e6 / t, $client))
"
}

echo "load before: $(uptime)"
printf '%-14s %9s %10s %10s %12s %12s %12s %12s\n' mode in_flight hits/s us/hit scripts/hit cmds/hit redis_us/hit client_us/hit
for round in $(seq "$ROUNDS"); do
  for c in 64 1; do
    for m in keys hot; do
      if [ $((round % 2)) -eq 1 ]; then order="$m $m-single"; else order="$m-single $m"; fi
      for mode in $order; do
        [ "$c" -eq 1 ] && [ "${mode%-single}" = hot ] && continue
        measure "$mode" "$c"
      done
    done
  done
done
echo "load after: $(uptime)"
[ "$CEILING" = 0 ] && exit 0
echo

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
  pinned=$("$bench" "$url" pinned "$c" "$SECS" | cut -d' ' -f1)
  redis-cli -p "$port" flushall >/dev/null
  naive=$("$bench" "$url" naive "$c" "$SECS" | cut -d' ' -f1)
  n=$(python3 -c "print(max(20000, int($pinned * $SECS)))")
  ceil_c=$(rps -c "$c" -n "$n")
  ceil_p=$(rps -c 1 -P "$c" -n "$n")
  printf '%9s  %13.0f  %12.0f  %13.0f  %13.0f  %14.2f  %12.2f\n' "$c" "$pinned" "$naive" "$ceil_c" "$ceil_p" \
    "$(python3 -c "print($pinned / max($ceil_c, $ceil_p))")" "$(python3 -c "print($pinned / $naive)")"
done

calls() { redis-cli -p "$port" info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_(evalsha|eval):/ {n += $3} END {print n + 0}'; }
redis-cli -p "$port" config resetstat >/dev/null
before=$(calls)
denied=$("$bench" "$url" denied 64 "$SECS" | cut -d' ' -f1)
after=$(calls)
echo
echo "deny cache: $denied denied hits/s at 64 in flight; EVAL/EVALSHA calls in that run: $((after - before)), of which 2 put the key over its limit"
