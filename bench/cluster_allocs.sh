#!/usr/bin/env bash
# Heap allocations per request on a Redis Cluster: the Cluster client this
# crate makes (`RedisBackend::connect_cluster`, whose nodes are
# `ClusterNode`s with bounded probes) beside the `redis` crate's own client,
# in one run of bench/examples/allocs.rs. The difference is what the crate's
# client adds to a hit on a healthy Cluster (its target: nothing).
#
#   bash bench/cluster_allocs.sh
#
# It starts its own three-master Cluster on free ports of 127.0.0.1, in a
# temporary directory (never a Redis it did not start), and stops it at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install redis-server" >&2; exit 1; }
dir=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
# A free port whose Cluster bus port (10,000 above it) is free too.
free_cluster_port() { python3 tools/free_cluster_port.py; }
ports=()
for i in 1 2 3; do
  port=$(free_cluster_port)
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir/$port" --logfile "$dir/$port/redis.log" \
    --cluster-enabled yes --cluster-config-file nodes.conf >/dev/null &
  pids+=("$!")
  ports+=("$port")
done
for port in "${ports[@]}"; do
  for _ in $(seq 1 100); do
    [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && break
    sleep 0.1
  done
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-yes >"$dir/create.log" 2>&1 \
  || { cat "$dir/create.log" >&2; exit 1; }
for port in "${ports[@]}"; do
  for _ in $(seq 1 100); do
    redis-cli -p "$port" CLUSTER INFO | grep -q cluster_state:ok && break
    sleep 0.1
  done
done
urls=$(printf 'redis://127.0.0.1:%s/,' "${ports[@]}")
REDIS_CLUSTER_URLS=${urls%,} cargo run --release --quiet -p tower-pinned-window-bench \
  --features cluster --example allocs
