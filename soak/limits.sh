#!/usr/bin/env bash
# Soak: limits held in the store that change under load (issue 43), four
# instances on one Redis, then on PostgreSQL. See soak/README.md.
#
# One process of bench/src/bin/limits_soak.rs holds $INSTANCES (4)
# instances, each a RateLimitLayer with a backend of its own (its own Redis
# connection, its own PostgreSQL pool) and a LimitBook of its own
# (staleness $STALENESS_MS), under $WORKERS x $RATE requests a second each
# on $KEYS keys, while a controller sets the layer's stored limit every
# $PERIOD_MS to the next of $LIMITS for $DURATION s; then two steady
# stretches of $STEADY s, with the book and with a fixed quota, the store's
# calls read around each. On Redis it starts its own redis-server on a free
# port (never one it did not start); on PostgreSQL ($DATABASE_URL) it works
# in a schema of its own, dropped at the end. Exits 1 when an invariant
# fails on either store.
#
#   bash soak/limits.sh
#   STORES=redis DURATION=60 bash soak/limits.sh
#   LIMITS=5,40 STALENESS_MS=100 bash soak/limits.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export KEYS=${KEYS:-4} WORKERS=${WORKERS:-16} RATE=${RATE:-400}
export LIMIT=${LIMIT:-40} WINDOW_MS=${WINDOW_MS:-1000} LIMITS=${LIMITS:-10,30,15,40}
export PERIOD_MS=${PERIOD_MS:-1000} STALENESS_MS=${STALENESS_MS:-200} READ_MS=${READ_MS:-100}
export DURATION=${DURATION:-30} STEADY=${STEADY:-10}
STORES=${STORES:-"redis postgres"}
. soak/common.sh
export INSTANCES DURATION

failed=
drop_schema() {
  if [ -n "${SCHEMA:-}" ]; then
    psql -X -q "$DATABASE_URL" -c "DROP SCHEMA IF EXISTS \"$SCHEMA\" CASCADE" >/dev/null 2>&1 || true
  fi
}
cleanup() { stop_started; drop_schema; if [ -n "${dir:-}" ]; then rm -rf "$dir"; fi; }
for store in $STORES; do
  case $store in
    redis)
      begin_redis_soak limits_soak
      trap cleanup EXIT
      port=$(free_port)
      export REDIS_URL="redis://127.0.0.1:$port/" PREFIX="tpw-limits:$$:"
      start_redis
      echo "== Redis (port $port)"
      RUST_LOG=${RUST_LOG:-error} "$soak_bin" redis || failed=1
      stop_started
      ;;
    postgres)
      command -v psql >/dev/null || { echo "psql not found (apt-get install postgresql-client)" >&2; exit 1; }
      export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
      export SCHEMA=tpw_limits_$$
      build_soak limits_soak
      trap cleanup EXIT
      trap 'exit 130' INT TERM
      echo "== PostgreSQL ($DATABASE_URL, schema $SCHEMA)"
      RUST_LOG=${RUST_LOG:-error} "$soak_bin" postgres || failed=1
      drop_schema
      ;;
    *) echo "STORES: redis or postgres, not $store" >&2; exit 1 ;;
  esac
done
[ -z "$failed" ]
