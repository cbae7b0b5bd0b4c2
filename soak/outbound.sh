#!/usr/bin/env bash
# Soak: the client layer (outbound::BudgetLayer) of four processes sharing
# one provider's budget through one Redis, killed with kill -9 and
# restarted. See soak/README.md.
#
# It starts its own standalone redis-server on a free port of 127.0.0.1, in
# a temporary directory, without persistence (never a Redis it did not
# start), a fake provider (an axum server that answers 200 and notes when
# each call came), then $INSTANCES (4) client processes of
# bench/src/bin/outbound_soak.rs, each $CALLERS (32) callers calling the
# provider in a loop through a hyper-util client behind a BudgetLayer of
# $LIMIT calls a $WINDOW_MS ms window (200 a second), over a RedisBackend of
# its own, failing closed (INSURE_SHARE=1/4: the insurance limiter at that
# share). At $KILL_AT seconds Redis gets SIGKILL; $DOWN_FOR seconds later it
# starts again on the same port, empty (KILL_AT=off: no fault). The store is scanned for counters
# without an expiry at the seconds of $SCAN_AT (not while it is down) and at
# the end. The report exits 1 on any window that admitted more than $LIMIT,
# call sent without the store's word (failing closed), counter without an
# expiry, or call failed for anything but the store's failure.
#
#   bash soak/outbound.sh
#   INSURE_SHARE=1/4 bash soak/outbound.sh    # the same run, insured during the outage
#   KEEP=/tmp/out1 bash soak/outbound.sh      # keep the calls, the answers and the events
#   KILL_AT=off bash soak/outbound.sh         # the load alone, Redis up throughout
set -euo pipefail
cd "$(dirname "$0")/.."
export LIMIT=${LIMIT:-200} WINDOW_MS=${WINDOW_MS:-1000} CALLERS=${CALLERS:-32}
DURATION=${DURATION:-60}
. soak/common.sh
KILL_AT=${KILL_AT:-25}
DOWN_FOR=${DOWN_FOR:-3}
if [ "$KILL_AT" = off ]; then
  SCAN_AT=${SCAN_AT:-"10 20 31 45 55"}
else
  SCAN_AT=${SCAN_AT:-"10 20 $(( KILL_AT + DOWN_FOR + 3 )) 45 55"}
fi
export RETRY_MS=${RETRY_MS:-20} PREFIX="tpw-outbound:$$:"
if [ "${INSURE_SHARE:-off}" = off ]; then unset INSURE_SHARE; else export INSURE_SHARE; fi
begin_redis_soak outbound_soak

port=$(free_port)
export REDIS_URL="redis://127.0.0.1:$port/"
start_redis
# The script calls Redis served (EVALSHA), from its INFO commandstats: a
# line `calls UNIX_MS $1 N` in the events.
count_calls() {
  local n
  n=$(redis-cli -h 127.0.0.1 -p "$port" INFO commandstats | tr -d '\r' |
    awk -F'[:=,]' '$1 == "cmdstat_evalsha" { print $3 }')
  echo "calls $(now_ms) $1 ${n:-0}" >>"$dir/events"
}

export PROVIDER_ADDR="127.0.0.1:$(free_port)"
# Two seconds for every process to start; the load runs from START_MS.
export START_MS=$(( $(now_ms) + 2000 ))
export END_MS=$(( START_MS + DURATION * 1000 ))
RUST_LOG=${RUST_LOG:-error} "$soak_bin" provider "$dir/provider" &
started+=("$!")
provider_pid=$!
instances=()
for i in $(seq 1 "$INSTANCES"); do
  RUST_LOG=${RUST_LOG:-error} "$soak_bin" client "$i" "$dir/answers.$i" &
  started+=("$!")
  instances+=("$!")
done
echo "outbound soak: $INSTANCES clients x $CALLERS callers for $DURATION s, a budget of $LIMIT per $WINDOW_MS ms, failure policy ${INSURE_SHARE:+insurance at }${INSURE_SHARE:-fail closed};" \
  "Redis (port $port) $([ "$KILL_AT" = off ] && echo "up throughout" || echo "killed at $KILL_AT s, restarted $DOWN_FOR s later")"
{ echo "event $START_MS load-start"; echo "event $END_MS load-end"; } >"$dir/events"

scan_between() { # from to (seconds into the load): the scans of $SCAN_AT in [from, to)
  local t
  for t in $SCAN_AT; do
    if [ "$t" -ge "$1" ] && [ "$t" -lt "$2" ]; then
      sleep_until $(( START_MS + t * 1000 ))
      scan_redis "at-${t}s" "$port"
    fi
  done
}
if [ "$KILL_AT" = off ]; then
  scan_between 0 "$DURATION"
else
  scan_between 0 "$KILL_AT"
  sleep_until $(( START_MS + KILL_AT * 1000 ))
  count_calls before-kill
  killed_at=$(now_ms)
  { kill -9 "$redis_pid"; wait "$redis_pid"; } 2>/dev/null || true
  echo "fault $killed_at redis-kill-9" >>"$dir/events"
  sleep_until $(( START_MS + (KILL_AT + DOWN_FOR) * 1000 ))
  start_redis
  echo "event $(now_ms) redis-restarted" >>"$dir/events"
  scan_between $(( KILL_AT + DOWN_FOR )) "$DURATION"
fi

wait_instances || failed=1
scan_redis end "$port"
count_calls end
wait "$provider_pid" || failed=1
"$soak_bin" report "$dir/events" "$dir/provider" $(printf "$dir/answers.%s " $(seq 1 "$INSTANCES")) && [ -z "${failed:-}" ]
