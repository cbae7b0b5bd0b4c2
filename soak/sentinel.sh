#!/usr/bin/env bash
# Soak: Redis Sentinel, a master killed with kill -9 under the load of four
# instances of a service. See soak/README.md.
#
# It starts its own Redis master, replica and three sentinels on free ports
# of 127.0.0.1, in a temporary directory (never a Redis it did not start),
# then $INSTANCES (4) processes of bench/src/bin/soak.rs, each a
# RateLimitLayer over RedisBackend over SentinelConnection, sending $RATE
# requests a second each for $DURATION seconds. At $KILL_AT seconds the
# master gets SIGKILL and the sentinels promote the replica. The store is
# scanned for counters without an expiry $SCAN_AFTER seconds after the
# promotion, and at the end. The report exits 1 on any over-admission,
# counter without an expiry, or answer of 500.
#
#   bash soak/sentinel.sh
#   DURATION=60 KILL_AT=20 bash soak/sentinel.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. soak/common.sh
KILL_AT=${KILL_AT:-$(( DURATION * 3 / 10 ))}
SCAN_AFTER=${SCAN_AFTER:-5}
export MASTER_NAME=tpw-soak PREFIX="tpw-soak:$$:"
begin_redis_soak

cli() { redis-cli -h 127.0.0.1 -p "$@"; }
# Wait up to 20 s for `$2...` to succeed; say what was awaited ($1) if not.
await() {
  local what=$1 i; shift
  for i in $(seq 1 200); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "timed out waiting for $what; logs in $dir:" >&2
  tail -n 20 "$dir"/*/*.log >&2
  exit 1
}
redis() { # name port extra args...
  local name=$1 port=$2; shift 2
  mkdir -p "$dir/$name"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir/$name" --logfile "$dir/$name/redis.log" --repl-diskless-sync-delay 0 "$@" &
  started+=("$!")
  await "$name to answer" bash -c "[ \"\$(redis-cli -h 127.0.0.1 -p $port PING)\" = PONG ]"
}
master_port=$(free_port)
redis master "$master_port"
master_pid=${started[-1]}
replica_port=$(free_port)
redis replica "$replica_port" --replicaof 127.0.0.1 "$master_port"
await "the replica to be in sync" bash -c "redis-cli -h 127.0.0.1 -p $replica_port INFO replication | grep -q master_link_status:up"
sentinels=()
for s in 1 2 3; do
  port=$(free_port)
  mkdir -p "$dir/sentinel$s"
  cat >"$dir/sentinel$s/sentinel.conf" <<CONF
port $port
bind 127.0.0.1
dir $dir/sentinel$s
logfile $dir/sentinel$s/sentinel.log
sentinel monitor $MASTER_NAME 127.0.0.1 $master_port 2
sentinel down-after-milliseconds $MASTER_NAME 1000
sentinel failover-timeout $MASTER_NAME 10000
sentinel parallel-syncs $MASTER_NAME 1
CONF
  redis-server "$dir/sentinel$s/sentinel.conf" --sentinel &
  started+=("$!")
  sentinels+=("$port")
done
for port in "${sentinels[@]}"; do
  await "sentinel $port to know the replica and the other sentinels" bash -c \
    "redis-cli -h 127.0.0.1 -p $port SENTINEL MASTER $MASTER_NAME | paste - - | grep -qx \$'num-slaves\t1' &&
     redis-cli -h 127.0.0.1 -p $port SENTINEL MASTER $MASTER_NAME | paste - - | grep -qx \$'num-other-sentinels\t2'"
done
SENTINELS=$(printf 'redis://127.0.0.1:%s/,' "${sentinels[@]}")
export SENTINELS=${SENTINELS%,}

master_now() { cli "${sentinels[0]}" SENTINEL GET-MASTER-ADDR-BY-NAME "$MASTER_NAME" | sed -n 2p; }

echo "sentinel soak: $INSTANCES instances x $RATE requests/s for $DURATION s, $KEYS keys, $LIMIT per $WINDOW_MS ms; master (port $master_port) killed at $KILL_AT s"
: >"$dir/events"
start_instances sentinel
start=$(( END_MS - DURATION * 1000 ))
sleep_until $(( start + KILL_AT * 1000 ))
{ kill -9 "$master_pid"; wait "$master_pid"; } 2>/dev/null || true
echo "fault $(now_ms) master-kill-9" >>"$dir/events"
for i in $(seq 1 600); do
  if [ "$(master_now)" = "$replica_port" ]; then
    echo "event $(now_ms) sentinels-promote-the-replica" >>"$dir/events"
    break
  fi
  sleep 0.05
done
[ "$(master_now)" = "$replica_port" ] || echo "the sentinels did not promote the replica within 30 s" >&2
sleep "$SCAN_AFTER"
scan_redis after-failover "$replica_port"
wait_instances || failed=1
scan_redis end "$replica_port"
"$soak_bin" report "$dir/events" "$dir"/answers.* && [ -z "${failed:-}" ]
