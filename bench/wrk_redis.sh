#!/usr/bin/env bash
# Requests per second through the quickstart-style axum server with the
# Redis backend, against the same server without the layer that writes the
# layer's two headers as constants (`LIMIT=static-headers`: the limiter's
# own logic is what is measured), in the same run, ROUNDS interleaved
# rounds, the ratio of each round and the median. Two cases:
#   keys  10,000 keys (bench/wrk_keys.lua) at KEYS_CONNECTIONS (64)
#   hot   one hot key (bench/wrk_hot.lua) at HOT_CONNECTIONS (16)
# ROUTES names the layers measured beside bare (default: redis): redis, the
# plain hit; redis-cost, a spend of 1 a request; redis-charged, a check then
# a charge of 1 after the answer (a token budget); redis-single, one EVALSHA
# per hit (`.coalesce(false)`; SINGLE=1 adds it, as before); redis-wait, the
# plain hit in the replica-acknowledged mode (`wait_for_replicas(1, 100 ms)`);
# redis-limited, the plain hit with a real limit (5 per 10 s per key), where
# most requests are denied: its line adds the denials (wrk's non-2xx), those
# answered by the deny cache with no hit sent to Redis (requests less the
# hits Redis counted, the sum of its counters once the run is over: a hit
# that reaches Redis is counted, denied or not) and the cache's hit rate
# (local denials over denials); redis-in-flight, the in-flight cap
# (`InFlightLayer`, a cap no key reaches) instead of the rate limit: a take
# before the handler and a give-back when the body ends, both through the
# lanes (its script calls per request count both); redis-in-flight-single,
# the same with one call a step (`.coalesce(false)`); redis-capped, the
# plain hit with an in-flight cap in the same layer (`RateLimitLayer::
# in_flight`): one step takes the slot and counts the hit, a give-back
# follows; redis-book, the plain hit with its limit held in the same Redis
# (a LimitBook read at most once a second, in the background: its reads,
# HGETALL, are not script calls; the line adds how many it made).
# With REPLICA=1, or when ROUTES has redis-wait, the Redis has a replica
# (`--replicaof`, started by the script too), for every route of the run, so
# that the routes are compared on the same master. Each route's
# script calls per request (EVALSHA and EVAL, from INFO commandstats, over
# wrk's requests) are printed beside its rate, and each route's ratio to
# the plain redis route of the same round when both are measured.
# It starts its own redis-server on a free port of 127.0.0.1 (and its
# replica on another); the app is pinned to core 0 and wrk to core 1 (as in
# bench/wrk.sh), Redis is not.
#
#   bash bench/wrk_redis.sh            # 5 rounds of 10 s each way, both cases
#   ROUNDS=5 DURATION=5s CASES=hot bash bench/wrk_redis.sh
#   ROUTES="redis redis-cost redis-charged" CASES=keys bash bench/wrk_redis.sh
#   ROUTES="redis redis-wait" bash bench/wrk_redis.sh   # on a master with a replica
#   ROUTES="redis redis-in-flight" CASES=keys bash bench/wrk_redis.sh
#   ROUTES="redis redis-in-flight redis-capped" CASES=keys bash bench/wrk_redis.sh
#   ROUTES="redis redis-book" CASES=keys bash bench/wrk_redis.sh
#
# Needs wrk (Debian: apt-get install wrk) and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in wrk redis-server redis-cli python3 bc; do
  command -v "$bin" >/dev/null || { echo "$bin not found" >&2; exit 1; }
done

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-1}
KEYS_CONNECTIONS=${KEYS_CONNECTIONS:-64}
HOT_CONNECTIONS=${HOT_CONNECTIONS:-16}
CASES=${CASES:-keys hot}
SINGLE=${SINGLE:-0}
ROUTES=${ROUTES:-redis}
if [ "$SINGLE" = 1 ]; then ROUTES="$ROUTES redis-single"; fi
REPLICA=${REPLICA:-0}
case " $ROUTES " in *" redis-wait "*) REPLICA=1 ;; esac
PORT=${PORT:-3918}

dir=$(mktemp -d)
rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --logfile "$dir/log" --daemonize yes --pidfile "$dir/pid"
trap 'redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
if [ "$REPLICA" = 1 ]; then
  mkdir "$dir/replica"
  rrport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$rrport" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir/replica" \
    --logfile "$dir/replica/log" --daemonize yes --pidfile "$dir/replica/pid" \
    --replicaof 127.0.0.1 "$rport"
  trap 'redis-cli -p "$rrport" shutdown nosave >/dev/null 2>&1 || true; redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
  for _ in $(seq 100); do
    redis-cli -p "$rrport" info replication 2>/dev/null | grep -q 'master_link_status:up' && break
    sleep 0.1
  done
  redis-cli -p "$rrport" info replication | grep -q 'master_link_status:up' || { echo "the replica did not sync" >&2; exit 1; }
  echo "the Redis on $rport has a replica on $rrport"
fi

cargo build --release -p tower-pinned-window-bench --bin wrk_server --quiet
server="${CARGO_TARGET_DIR:-target}"/release/wrk_server

calls() { # script calls the server has run so far
  redis-cli -p "$rport" info commandstats | tr -d '\r' |
    awk -F'[:=,]' '/^cmdstat_(evalsha|eval):/ {n += $3} END {print n + 0}'
}

reads() { # stored-limit reads (HGETALL) the server has run so far
  redis-cli -p "$rport" info commandstats | tr -d '\r' |
    awk -F'[:=,]' '/^cmdstat_hgetall:/ {n += $3} END {print n + 0}'
}

counted() { # hits Redis has counted, over every counter but the warm-up's (records of slots in flight are not counters)
  redis-cli -p "$rport" eval "local n = 0 for _, k in ipairs(redis.call('keys', 'tpw:*')) do if not string.find(k, '{warm}', 1, true) and redis.call('type', k).ok == 'string' then n = n + tonumber(redis.call('get', k)) end end return n" 0
}

run() { # $1 = LIMIT, $2 = connections, $3 = wrk script; prints requests/s, script calls per request, errors (non-2xx + socket errors), denials, denials answered locally, and stored-limit reads
  redis-cli -p "$rport" flushall >/dev/null
  LIMIT=$1 PORT=$PORT REDIS_URL="redis://127.0.0.1:$rport/" taskset -c 0 "$server" >/dev/null &
  local pid=$!
  for _ in $(seq 50); do curl -fs -H 'x-client: warm' "http://127.0.0.1:$PORT/" >/dev/null && break; sleep 0.1; done
  local out before after read_before
  before=$(calls); read_before=$(reads)
  out=$(taskset -c 1 wrk -t"$THREADS" -c"$2" -d"$DURATION" -s "$3" "http://127.0.0.1:$PORT/")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  after=$(calls)
  local rps requests bad denied reached
  denied=$(echo "$out" | awk '/Non-2xx/ {n = $NF} END {print n + 0}')
  reached=$(counted)
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  requests=$(echo "$out" | awk '/requests in/ {print $1}')
  bad=$(echo "$out" | awk '/Non-2xx/ {n = $NF} /Socket errors/ {s = $0; sub(/.*Socket errors: */, "", s); gsub(/ /, "", s)} END {printf "%d%s", n, (s == "" ? "" : "+socket:" s)}')
  echo "$rps $(echo "($after - $before) / $requests" | bc -l) $bad $denied $((requests - reached)) $(($(reads) - read_before)) $requests"
}

median() { sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "load before: $(uptime)"
for case in $CASES; do
  case $case in
    keys) conns=$KEYS_CONNECTIONS; script=bench/wrk_keys.lua ;;
    hot) conns=$HOT_CONNECTIONS; script=bench/wrk_hot.lua ;;
    *) echo "unknown case $case (keys, hot)" >&2; exit 1 ;;
  esac
  echo "case $case: $conns connections, $script"
  echo "round  route                   rps  ratio_to_bare  ratio_to_redis  calls/request  non-2xx[+socket errors]  [denied  local  hit_rate]"
  declare -A ratios=() plain=() percall=() hitrate=()
  for round in $(seq "$ROUNDS"); do
    read -r off _ _ < <(run static-headers "$conns" "$script")
    printf '%5d  %-22s %8.0f\n' "$round" bare "$off"
    declare -A rps=()
    for route in $ROUTES; do
      read -r on per bad denied local limit_reads requests < <(run "$route" "$conns" "$script")
      rps[$route]=$on
      ratio=$(echo "$on / $off" | bc -l)
      to_redis=-
      if [ -n "${rps[redis]:-}" ]; then
        to_redis=$(printf '%.3f' "$(echo "$on / ${rps[redis]}" | bc -l)")
        plain[$route]+="$to_redis "
      fi
      ratios[$route]+="$ratio "
      percall[$route]+="$per "
      printf '%5d  %-22s %8.0f  %13.3f  %14s  %13.3f  %s' "$round" "$route" "$on" "$ratio" "$to_redis" "$per" "$bad"
      if [ "$denied" -gt 0 ]; then
        rate=$(echo "$local / $denied" | bc -l)
        hitrate[$route]+="$rate "
        printf '  %d  %d  %.4f' "$denied" "$local" "$rate"
      fi
      if [ "$limit_reads" -gt 0 ]; then
        printf '  (stored-limit reads: %d in %d requests)' "$limit_reads" "$requests"
      fi
      printf '\n'
    done
    unset rps
  done
  for route in $ROUTES; do
    printf 'median (%s, %s): ratio to bare %.3f' "$case" "$route" "$(printf '%s\n' ${ratios[$route]} | median)"
    if [ -n "${plain[$route]:-}" ] && [ "$route" != redis ]; then
      printf ', ratio to redis %.3f' "$(printf '%s\n' ${plain[$route]} | median)"
    fi
    printf ', script calls per request %.3f' "$(printf '%s\n' ${percall[$route]} | median)"
    if [ -n "${hitrate[$route]:-}" ]; then
      printf ', deny cache hit rate %.4f' "$(printf '%s\n' ${hitrate[$route]} | median)"
    fi
    printf '\n'
  done
  unset ratios plain percall hitrate
done
echo "load after: $(uptime)"
