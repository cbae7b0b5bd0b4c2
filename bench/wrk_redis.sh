#!/usr/bin/env bash
# Requests per second through the quickstart-style axum server with the
# Redis backend (10,000 keys: bench/wrk_keys.lua), coalesced (the default)
# and with one EVALSHA per hit (`.coalesce(false)`), against the same server
# without the layer, in the same run, ROUNDS rounds, and the ratios to it.
# It starts its own redis-server on a free port of 127.0.0.1; the app is
# pinned to core 0 and wrk to core 1 (as in bench/wrk.sh), Redis is not.
#
#   bash bench/wrk_redis.sh            # 3 rounds of 10 s each way
#   ROUNDS=5 DURATION=20s bash bench/wrk_redis.sh
#
# Needs wrk (Debian: apt-get install wrk) and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in wrk redis-server redis-cli python3 bc; do
  command -v "$bin" >/dev/null || { echo "$bin not found" >&2; exit 1; }
done

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-1}
CONNECTIONS=${CONNECTIONS:-64}
PORT=${PORT:-3918}

dir=$(mktemp -d)
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --logfile "$dir/log" --daemonize yes --pidfile "$dir/pid"
trap 'redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done

cargo build --release -p tower-pinned-window-bench --bin wrk_server --quiet
server="${CARGO_TARGET_DIR:-target}"/release/wrk_server

run() { # $1 = LIMIT; prints requests/s and errors (non-2xx + socket errors)
  redis-cli -p "$rport" flushall >/dev/null
  LIMIT=$1 PORT=$PORT REDIS_URL="redis://127.0.0.1:$rport/" taskset -c 0 "$server" >/dev/null &
  local pid=$!
  for _ in $(seq 50); do curl -fs "http://127.0.0.1:$PORT/" >/dev/null && break; sleep 0.1; done
  local out
  out=$(taskset -c 1 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" -s bench/wrk_keys.lua "http://127.0.0.1:$PORT/")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local rps bad
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  bad=$(echo "$out" | awk '/Non-2xx/ {n += $NF} /Socket errors/ {n += 1} END {print n + 0}')
  echo "$rps $bad"
}

echo "load before: $(uptime)"
echo "round  bare_rps  redis_rps  ratio  single_rps  ratio  redis/single  (non-2xx or socket errors: redis, single)"
sum_off=0; sum_on=0; sum_single=0
for round in $(seq "$ROUNDS"); do
  read -r off _ < <(run off)
  read -r on bad_on < <(run redis)
  read -r single bad_single < <(run redis-single)
  sum_off=$(echo "$sum_off + $off" | bc -l); sum_on=$(echo "$sum_on + $on" | bc -l); sum_single=$(echo "$sum_single + $single" | bc -l)
  printf '%5d  %8.0f  %9.0f  %5.3f  %10.0f  %5.3f  %12.2f  (%s, %s)\n' "$round" "$off" "$on" "$(echo "$on / $off" | bc -l)" \
    "$single" "$(echo "$single / $off" | bc -l)" "$(echo "$on / $single" | bc -l)" "$bad_on" "$bad_single"
done
printf 'total  %8.0f  %9.0f  %5.3f  %10.0f  %5.3f  %12.2f\n' "$sum_off" "$sum_on" "$(echo "$sum_on / $sum_off" | bc -l)" \
  "$sum_single" "$(echo "$sum_single / $sum_off" | bc -l)" "$(echo "$sum_on / $sum_single" | bc -l)"
echo "load after: $(uptime)"
