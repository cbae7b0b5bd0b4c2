#!/usr/bin/env bash
# Soak: a Redis Cluster through a master killed with kill -9, then a master
# frozen with SIGSTOP through its failover while a third shard is failed over
# by hand, under the load of four instances of a service. See soak/README.md.
#
# It starts its own Cluster of 3 masters and 3 replicas on free ports of
# 127.0.0.1, in a temporary directory (cluster-require-full-coverage no,
# cluster-node-timeout $NODE_TIMEOUT_MS; never a Redis it did not start),
# then $INSTANCES (4) processes of bench/src/bin/soak.rs, each a
# RateLimitLayer over RedisBackend::connect_cluster (the layer's 100 ms
# timeout, the breakers on), $WORKERS (32) clients each, over $KEYS (2,000)
# keys. The faults, each on a shard of its own:
#
#   KILL_AT      the first master gets SIGKILL; its replica is promoted; the
#                killed master starts again (same port and nodes.conf)
#                RESTART_AFTER seconds after the promotion, and rejoins as
#                the new master's replica (RESTART_AFTER=off leaves it dead);
#   FREEZE_AT    the second master gets SIGSTOP; its replica is promoted;
#   + MANUAL_AFTER  the third shard's replica gets CLUSTER FAILOVER (not
#                before the frozen master's replica is promoted), which makes
#                the clients read the slot map again while a node is silent;
#   + FREEZE_FOR the frozen master gets SIGCONT and turns replica.
#
# Every master is scanned for counters without an expiry SCAN_AFTER seconds
# after each promotion, after the thaw, and at the end. The report exits 1 on
# any counter without an expiry, answer of 500, answer of 503 on a key of a
# master that was healthy then, or, with ACK=1 (hits acknowledged by a
# replica), any over-admission.
#
#   bash soak/cluster.sh
#   DURATION=60 KILL_AT=10 FREEZE_AT=25 bash soak/cluster.sh
#   KEEP=/tmp/run1 bash soak/cluster.sh     # keep the answers and the events
set -euo pipefail
cd "$(dirname "$0")/.."
# Enough keys that the store is asked throughout: a key gets about one
# request a second, and fills its window (50 a minute) only after the faults.
export KEYS=${KEYS:-2000} LIMIT=${LIMIT:-50} WINDOW_MS=${WINDOW_MS:-60000}
export RATE=${RATE:-500} WORKERS=${WORKERS:-32}
DURATION=${DURATION:-75}
. soak/common.sh
NODE_TIMEOUT_MS=${NODE_TIMEOUT_MS:-3000}
KILL_AT=${KILL_AT:-12}
RESTART_AFTER=${RESTART_AFTER:-3}
FREEZE_AT=${FREEZE_AT:-30}
MANUAL_AFTER=${MANUAL_AFTER:-7}
FREEZE_FOR=${FREEZE_FOR:-10}
SCAN_AFTER=${SCAN_AFTER:-2}
export ACK=${ACK:-0} PREFIX="tpw-soak:$$:" KEY_SLOTS
begin_redis_soak
KEY_SLOTS=$dir/slots

cli() { timeout 5 redis-cli -h 127.0.0.1 -p "$@"; }
# Wait up to 20 s for `$2...` to succeed; say what was awaited ($1) if not.
await() {
  local what=$1 i; shift
  for i in $(seq 1 200); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "timed out waiting for $what; logs in $dir:" >&2
  tail -n 20 "$dir"/*/redis.log >&2
  exit 1
}
declare -A pid_of
node() { # port: start the Cluster node on it (again, with its nodes.conf)
  local port=$1
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir/$port" --logfile "$dir/$port/redis.log" --repl-diskless-sync-delay 0 \
    --cluster-enabled yes --cluster-config-file nodes.conf \
    --cluster-node-timeout "$NODE_TIMEOUT_MS" --cluster-require-full-coverage no &
  started+=("$!")
  pid_of[$port]=$!
  await "node $port to answer" bash -c "[ \"\$(redis-cli -h 127.0.0.1 -p $port PING)\" = PONG ]"
}
# A free port whose Cluster bus port (10,000 above it) is free too.
free_cluster_port() { python3 tools/free_cluster_port.py; }
ports=()
for i in 1 2 3 4 5 6; do
  ports+=("$(free_cluster_port)")
  node "${ports[-1]}"
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 1 --cluster-yes \
  >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; exit 1; }

# The Cluster as node $1 sees it, one line a node: `port flags master_port
# slots` (master_port and slots `-` when none; slots as `0-5460,5462`).
view() {
  cli "$1" CLUSTER NODES | awk '
    { split($2, a, "[:@]"); id[NR] = $1; port[$1] = a[2]; flags[$1] = $3; master[$1] = $4
      s = ""; for (i = 9; i <= NF; i++) if ($i !~ /^\[/) s = s (s == "" ? "" : ",") $i
      slots[$1] = (s == "" ? "-" : s) }
    END { for (n = 1; n <= NR; n++) { k = id[n]
      print port[k], flags[k], (master[k] == "-" ? "-" : port[master[k]]), slots[k] } }'
}
# The masters that serve slots and are not failing, as node $1 sees them.
live_masters() { view "$1" | awk '$2 ~ /master/ && $2 !~ /fail/ && $4 != "-" { print $1 }'; }
slots_of() { view "$1" | awk -v p="$2" '$1 == p { print $4 }'; }
replica_of() { view "$1" | awk -v p="$2" '$2 ~ /slave/ && $3 == p { print $1; exit }'; }
role() { cli "$1" ROLE 2>/dev/null | head -n 1; }
# Node $1's view without its own `myself` flag, sorted: the same on every
# node once they agree.
plain_view() { view "$1" | sed 's/myself,//' | sort; }
ok_everywhere() {
  local port first
  first=$(plain_view "${ports[0]}")
  # 3 masters with slots, 3 replicas each of a known master, no flag but those.
  [ "$(awk '$2 == "master" && $4 != "-"' <<<"$first" | wc -l)" = 3 ] || return 1
  [ "$(awk '$2 == "slave" && $3 != "-"' <<<"$first" | wc -l)" = 3 ] || return 1
  for port in "${ports[@]}"; do
    cli "$port" CLUSTER INFO | grep -q cluster_state:ok || return 1
    cli "$port" CLUSTER INFO | grep -q cluster_slots_ok:16384 || return 1
    [ "$(plain_view "$port")" = "$first" ] || return 1
  done
  for port in $(awk '$2 == "slave" { print $1 }' <<<"$first"); do
    cli "$port" INFO replication | grep -q master_link_status:up || return 1
  done
}
await "the Cluster to be ok, its nodes agreeing, each replica in sync" ok_everywhere

# The three shards, by their first slot: one fault each.
mapfile -t masters < <(view "${ports[0]}" | awk '$2 ~ /master/ { print $4, $1 }' | sort -n | awk '{ print $2 }')
killed=${masters[0]} frozen=${masters[1]} manual=${masters[2]}
killed_replica=$(replica_of "${ports[0]}" "$killed")
frozen_replica=$(replica_of "${ports[0]}" "$frozen")
manual_replica=$(replica_of "${ports[0]}" "$manual")
[ -n "$killed_replica" ] && [ -n "$frozen_replica" ] && [ -n "$manual_replica" ] ||
  { echo "a master without a replica:" >&2; view "${ports[0]}" >&2; exit 1; }
NODES=$(printf 'redis://127.0.0.1:%s/,' "${ports[@]}")
export NODES=${NODES%,}

# Each key's slot, for the report; fails here (before any load) on a setting
# the instances would refuse.
"$soak_bin" cluster-keys "$KEY_SLOTS"

# Scan every live master (as node $2 sees them) for the run's counters
# without an expiry; one `scan` line each, named $1@port.
scan_masters() {
  local port
  for port in $(live_masters "$2"); do scan_redis "$1@$port" "$port"; done
}
# Wait until node $1 has role $2 (master, slave), polling every 50 ms, up to
# $3 (Unix ms); then write the moment $4 to the events. 1 when not.
await_role() {
  while [ "$(now_ms)" -lt "$3" ]; do
    if [ "$(role "$1")" = "$2" ]; then echo "event $(now_ms) $4" >>"$dir/events"; return 0; fi
    sleep 0.05
  done
  echo "node $1 was not $2 in time ($4)" >&2
  return 1
}
# Before a fault: the slots of the master $2 it strikes, as node $3 sees them.
note_slots() { echo "slots $(now_ms) $1 $(slots_of "$3" "$2")" >>"$dir/events"; }

echo "cluster soak: $INSTANCES instances x $RATE requests/s ($WORKERS clients each) for $DURATION s, $KEYS keys, $LIMIT per $WINDOW_MS ms, node timeout $NODE_TIMEOUT_MS ms, ACK=$ACK;" \
  "master $killed (replica $killed_replica) killed at $KILL_AT s; master $frozen (replica $frozen_replica) frozen at $FREEZE_AT s for $FREEZE_FOR s;" \
  "shard of $manual failed over by hand to $manual_replica at $MANUAL_AFTER s into the freeze"
: >"$dir/events"
start_instances cluster
start=$(( END_MS - DURATION * 1000 ))

# 1. kill -9, and the replica's promotion.
sleep_until $(( start + KILL_AT * 1000 ))
note_slots master-kill-9 "$killed" "$manual"
{ kill -9 "${pid_of[$killed]}"; wait "${pid_of[$killed]}"; } 2>/dev/null || true
echo "fault $(now_ms) master-kill-9" >>"$dir/events"
if await_role "$killed_replica" master $(( start + FREEZE_AT * 1000 )) replica-promoted; then
  sleep "$SCAN_AFTER"
  scan_masters after-kill-promotion "$manual"
  if [ "$RESTART_AFTER" != off ]; then
    sleep "$RESTART_AFTER"
    node "$killed"
    echo "event $(now_ms) killed-master-restarted" >>"$dir/events"
    await_role "$killed" slave $(( $(now_ms) + 20000 )) killed-master-now-replica || true
    await "the restarted master to be in sync as a replica" bash -c \
      "redis-cli -h 127.0.0.1 -p $killed INFO replication | grep -q master_link_status:up"
  fi
fi

# 2. SIGSTOP through the failover; meanwhile another shard's manual failover.
sleep_until $(( start + FREEZE_AT * 1000 ))
note_slots master-sigstop "$frozen" "$manual"
kill -STOP "${pid_of[$frozen]}"
echo "fault $(now_ms) master-sigstop" >>"$dir/events"
thaw=$(( start + (FREEZE_AT + FREEZE_FOR) * 1000 ))
if await_role "$frozen_replica" master "$thaw" replica-promoted; then
  sleep_until $(( start + (FREEZE_AT + MANUAL_AFTER) * 1000 ))
  note_slots manual-failover "$manual" "$manual"
  cli "$manual_replica" CLUSTER FAILOVER >/dev/null
  echo "event $(now_ms) manual-failover-sent" >>"$dir/events"
  await_role "$manual_replica" master "$thaw" manual-failover-done || true
  scan_masters after-freeze-promotion "$manual_replica"
fi
sleep_until "$thaw"
kill -CONT "${pid_of[$frozen]}"
echo "event $(now_ms) sigcont" >>"$dir/events"
await_role "$frozen" slave $(( $(now_ms) + 20000 )) woken-master-now-replica || true
sleep "$SCAN_AFTER"
scan_masters after-thaw "$frozen_replica"

wait_instances || failed=1
scan_masters end "$frozen_replica"
"$soak_bin" report "$dir/events" "$dir"/answers.* && [ -z "${failed:-}" ]
