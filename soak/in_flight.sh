#!/usr/bin/env bash
# Soak: the in-flight cap (InFlightLayer) of four processes sharing one
# Redis; one process killed with kill -9 while it holds slots, Redis killed
# and restarted empty once. See soak/README.md.
#
# It starts its own standalone redis-server on a free port of 127.0.0.1, in
# a temporary directory, without persistence (never a Redis it did not
# start), then $INSTANCES (4) processes of bench/src/bin/in_flight_soak.rs:
# each serves an axum app through an InFlightLayer of $MAX per key, slots on
# a lease of $LEASE_MS, over a RedisBackend of its own, failing closed, and
# drives $CALLERS (64) callers against its own server, on keys every process
# uses and keys of its own, each call held by the handler for a while. A
# watcher reads every record of the run in Redis every $POLL_MS ms.
# At $KILL_AT seconds, instance $VICTIM gets SIGKILL while it holds slots;
# at $REDIS_KILL_AT seconds Redis gets SIGKILL, and $DOWN_FOR seconds later
# it starts again on the same port, empty. The store is also scanned for
# records without a lifetime at the seconds of $SCAN_AT (not while it is
# down) and at the end. The report exits 1 on any moment with more than
# $MAX of a key in flight, a slot of the dead process live past its lease
# (+ $MARGIN_MS), a record without a lifetime, a record left after the run,
# any answer of 500, or a request started while Redis was down.
#
#   bash soak/in_flight.sh
#   DURATION=60 KILL_AT=20 REDIS_KILL_AT=38 bash soak/in_flight.sh
#   KEEP=/tmp/if1 bash soak/in_flight.sh       # keep the logs, the watcher's looks and the events
set -euo pipefail
cd "$(dirname "$0")/.."
export MAX=${MAX:-4} LEASE_MS=${LEASE_MS:-3000} CALLERS=${CALLERS:-64}
export SHARED_KEYS=${SHARED_KEYS:-6} OWN_KEYS=${OWN_KEYS:-2}
DURATION=${DURATION:-50}
. soak/common.sh
VICTIM=${VICTIM:-2}
KILL_AT=${KILL_AT:-15}
REDIS_KILL_AT=${REDIS_KILL_AT:-30}
# Longer than the longest hold (LONG_MAX_MS, 4 s): every request in flight
# when Redis dies ends before it is back (see soak/README.md).
DOWN_FOR=${DOWN_FOR:-5}
SCAN_AT=${SCAN_AT:-"10 $(( KILL_AT + 2 )) 25 $(( REDIS_KILL_AT + DOWN_FOR + 3 )) 45"}
export POLL_MS=${POLL_MS:-50} MARGIN_MS=${MARGIN_MS:-250}
export PREFIX="tpw-inflight:$$:"
if [ "$VICTIM" -lt 1 ] || [ "$VICTIM" -gt "$INSTANCES" ]; then
  echo "VICTIM=$VICTIM is not one of the $INSTANCES instances" >&2; exit 1
fi
if [ $(( KILL_AT * 1000 + LEASE_MS + MARGIN_MS + 1000 )) -gt $(( REDIS_KILL_AT * 1000 )) ]; then
  echo "REDIS_KILL_AT must come a lease and more after KILL_AT: the dead process's slots are watched in between" >&2; exit 1
fi
begin_redis_soak in_flight_soak

port=$(free_port)
export REDIS_URL="redis://127.0.0.1:$port/"
start_redis

# Two seconds for every process to start; the load runs from START_MS. The
# watcher looks on until every lease taken before the end has run out: the
# longest hold, a lease and a second after the load's end.
export START_MS=$(( $(now_ms) + 2000 ))
export END_MS=$(( START_MS + DURATION * 1000 ))
instances=()
for i in $(seq 1 "$INSTANCES"); do
  RUST_LOG=${RUST_LOG:-error} "$soak_bin" instance "$i" "$dir/answers.$i" &
  started+=("$!")
  instances+=("$!")
done
STOP_MS=$(( END_MS + ${LONG_MAX_MS:-4000} + LEASE_MS + 1000 )) \
  RUST_LOG=${RUST_LOG:-error} "$soak_bin" watch "$dir/watch" &
started+=("$!")
watcher_pid=$!
echo "in-flight soak: $INSTANCES processes x $CALLERS callers for $DURATION s, at most $MAX in flight per key, a lease of $LEASE_MS ms, failing closed;" \
  "instance $VICTIM killed at $KILL_AT s, Redis (port $port) killed at $REDIS_KILL_AT s, restarted $DOWN_FOR s later"
{ echo "event $START_MS load-start"; echo "event $END_MS load-end"; } >"$dir/events"

scan_between() { # from to (seconds into the load): the scans of $SCAN_AT in [from, to)
  local t
  for t in $(printf '%s\n' $SCAN_AT | sort -n); do
    if [ "$t" -ge "$1" ] && [ "$t" -lt "$2" ]; then
      sleep_until $(( START_MS + t * 1000 ))
      WINDOW_MS=$LEASE_MS scan_redis "at-${t}s" "$port"
    fi
  done
}
# The slots the victim holds on its own keys, live or not.
victim_slots() {
  local k n total=0
  for k in $(seq 0 $(( OWN_KEYS - 1 ))); do
    n=$(redis-cli -h 127.0.0.1 -p "$port" ZCARD "${PREFIX}soak{p$VICTIM-$k}:slots" 2>/dev/null) || n=0
    total=$(( total + ${n:-0} ))
  done
  echo "$total"
}

scan_between 0 "$KILL_AT"
sleep_until $(( START_MS + KILL_AT * 1000 ))
# Killed while it holds slots of its own keys (waiting up to a second for
# some); the report fails when it held none.
for _ in $(seq 1 20); do
  if [ "$(victim_slots)" -gt 0 ]; then break; fi
  sleep 0.05
done
victim_pid=${instances[$(( VICTIM - 1 ))]}
killed_at=$(now_ms)
{ kill -9 "$victim_pid"; wait "$victim_pid"; } 2>/dev/null || true
echo "fault $killed_at instance-kill-9 $VICTIM" >>"$dir/events"
survivors=()
for i in "${!instances[@]}"; do
  if [ "$i" -ne $(( VICTIM - 1 )) ]; then survivors+=("${instances[$i]}"); fi
done
instances=("${survivors[@]}")

scan_between "$KILL_AT" "$REDIS_KILL_AT"
sleep_until $(( START_MS + REDIS_KILL_AT * 1000 ))
killed_at=$(now_ms)
{ kill -9 "$redis_pid"; wait "$redis_pid"; } 2>/dev/null || true
echo "fault $killed_at redis-kill-9" >>"$dir/events"
sleep_until $(( START_MS + (REDIS_KILL_AT + DOWN_FOR) * 1000 ))
start_redis
echo "event $(now_ms) redis-restarted" >>"$dir/events"
scan_between $(( REDIS_KILL_AT + DOWN_FOR )) "$DURATION"

wait_instances || failed=1
WINDOW_MS=$LEASE_MS scan_redis end "$port"
wait "$watcher_pid" || failed=1
"$soak_bin" report "$dir/events" "$dir/watch" $(printf "$dir/answers.%s " $(seq 1 "$INSTANCES")) && [ -z "${failed:-}" ]
