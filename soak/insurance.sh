#!/usr/bin/env bash
# Soak: the insurance limiter (FailurePolicy::Insurance) through a Redis
# killed with kill -9 and restarted, under the load of four instances of a
# service. See soak/README.md.
#
# It starts its own standalone redis-server on a free port of 127.0.0.1, in
# a temporary directory, without persistence (never a Redis it did not
# start), then $INSTANCES (4) processes of bench/src/bin/soak.rs, each a
# RateLimitLayer over RedisBackend over a ConnectionManager, failing over
# to the insurance limiter at a share of 1/$INSTANCES ($INSURE_SHARE). At
# $KILL_AT seconds Redis gets SIGKILL; $DOWN_FOR seconds later it starts
# again on the same port, empty. The store is scanned for counters without
# an expiry $SCAN_AFTER seconds after the restart, and at the end. The
# report exits 1 on any over-admission (of Redis's windows, or of an
# instance's local ones against its share), counter without an expiry,
# answer of 500, or answer of 503.
#
#   bash soak/insurance.sh
#   DURATION=60 KILL_AT=20 DOWN_FOR=10 bash soak/insurance.sh
#   INSURE_SHARE=off bash soak/insurance.sh    # the same run, failing closed
set -euo pipefail
cd "$(dirname "$0")/.."
. soak/common.sh
KILL_AT=${KILL_AT:-$(( DURATION * 3 / 10 ))}
DOWN_FOR=${DOWN_FOR:-15}
SCAN_AFTER=${SCAN_AFTER:-5}
export INSURE_SHARE=${INSURE_SHARE:-1/$INSTANCES} PREFIX="tpw-soak:$$:"
# INSURE_SHARE=off: the same run failing closed, for comparison.
[ "$INSURE_SHARE" != off ] || unset INSURE_SHARE
begin_redis_soak

port=$(free_port)
export REDIS_URL="redis://127.0.0.1:$port/"

start_redis
echo "insurance soak: $INSTANCES instances x $RATE requests/s for $DURATION s, $KEYS keys, $LIMIT per $WINDOW_MS ms, insurance share ${INSURE_SHARE:-off (fail closed)}; Redis (port $port) killed at $KILL_AT s, restarted $DOWN_FOR s later"
: >"$dir/events"
start_instances redis
start=$(( END_MS - DURATION * 1000 ))
sleep_until $(( start + KILL_AT * 1000 ))
{ kill -9 "$redis_pid"; wait "$redis_pid"; } 2>/dev/null || true
echo "fault $(now_ms) redis-kill-9" >>"$dir/events"
sleep_until $(( start + (KILL_AT + DOWN_FOR) * 1000 ))
start_redis
echo "event $(now_ms) redis-restarted-empty" >>"$dir/events"
sleep "$SCAN_AFTER"
scan_redis after-restart "$port"
wait_instances || failed=1
scan_redis end "$port"
"$soak_bin" report "$dir/events" "$dir"/answers.* && [ -z "${failed:-}" ]
