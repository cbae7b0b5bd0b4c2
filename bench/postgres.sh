#!/usr/bin/env bash
# Hits per second through the PostgreSQL backend at 1, 16 and 64 in flight,
# against the ceiling: pgbench running the same statement (src/backend/
# postgres/sql/hit.sql, prepared) at the same concurrency, on the same table,
# in the same run. Two workloads: `fresh` (every hit a new key: the insert
# path) and `hot` (each client hits its own key: the update path). Then the
# spends: `cost` (a spend of cost 1 a request) and `charged` (a check that
# opens the window, then a charge once answered) over 10,000 keys, with the
# statements (BEGIN and COMMIT included, from pg_stat_statements) and the
# transactions the database ran per request. Then the table's size under a
# flood of distinct keys with 1-second windows.
#
# It starts its own PostgreSQL (default settings, durable commits) on a free
# port of 127.0.0.1, in a temporary directory, as the `postgres` user when run
# as root; or uses DATABASE_URL when set. With durable commits every hit
# waits for a WAL flush, so a slow disk sets the pace for both;
# SYNCHRONOUS_COMMIT=off starts the server without that wait (what an
# UNLOGGED table gets too), where the CPU cost of each side shows.
#
#   bash bench/postgres.sh                       # 5 s per case
#   SYNCHRONOUS_COMMIT=off bash bench/postgres.sh
#   SECONDS_PER_CASE=10 FLOOD_SECONDS=120 bash bench/postgres.sh
#   ONLY_FLOOD=1 FLOOD_SECONDS=120 bash bench/postgres.sh
#   ONLY_SPENDS=1 bash bench/postgres.sh         # the cost and charged routes alone
#   POSTGRES_BENCH=/tmp/postgres_bench_before ONLY_SPENDS=1 bash bench/postgres.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECONDS_PER_CASE:-5}
bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$bin/pgbench" ] || { echo "PostgreSQL binaries not found (apt-get install postgresql, or set PG_BIN)" >&2; exit 1; }
pgbench=$bin/pgbench
export PATH="$bin:$PATH"

dir=$(mktemp -d)
schema=tpw_bench_$$
URL=
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
  [ -n "$URL" ] && psql -q "$URL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
  [ -f "$dir/data/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
if [ -n "${DATABASE_URL:-}" ]; then
  URL=$DATABASE_URL
else
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 >/dev/null
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200 -c synchronous_commit=${SYNCHRONOUS_COMMIT:-on} -c shared_preload_libraries=pg_stat_statements" start >/dev/null
  URL="postgres://postgres@127.0.0.1:$port/postgres"
fi
psql -q "$URL" -c "CREATE SCHEMA $schema"
# Statements per request on the spend routes; without it they read `nan`.
psql -q "$URL" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" 2>/dev/null || true

# POSTGRES_BENCH: a postgres_bench built elsewhere (another commit, to compare).
if [ -n "${POSTGRES_BENCH:-}" ]; then
  bench=$POSTGRES_BENCH
else
  cargo build --release -p tower-pinned-window-bench --bin postgres_bench --quiet
  bench="${CARGO_TARGET_DIR:-target}"/release/postgres_bench
fi
table="\"$schema\".\"tpw_counters\""
# The backend's statement, as the backend runs it for one hit alone (arrays
# of one counter), with pgbench variables for the key: $1 namespaces, $2
# keys, $3 hits per counter, $4 windows (ms), $5 the bound (ms).
hit_sql() { # $1: the key expression
  sed -e '/^--/d' -e "s/{table}/$table/g" -e "s/\\\$1/ARRAY['b']/g" -e "s/\\\$2/ARRAY[$1]/g" \
      -e 's/\$3/ARRAY[1]/g' -e 's/\$4/ARRAY[600000]/g' -e 's/\$5/3155760000000/g' postgres/src/sql/hit.sql | tr '\n' ' '
  echo ';'
}
{ echo '\set k random(1, 1000000000000)'; hit_sql "int8send(:k)"; } >"$dir/fresh.sql"
{ hit_sql "int4send(:client_id)"; } >"$dir/hot.sql"

"$bench" "$URL" "$schema" fresh 1 0.2 >/dev/null   # creates the table
reset_table() { psql -q "$URL" -c "TRUNCATE $table" ; psql -q "$URL" -c "VACUUM ANALYZE $table"; }
ceiling() { # mode, clients: pgbench's transactions per second
  "$pgbench" -n -M prepared -c "$2" -j "$(( $2 < 2 ? 1 : 2 ))" -T "$SECS" -f "$dir/$1.sql" "$URL" 2>/dev/null |
    awk '/^tps = / {print int($3)}'
}

[ -n "${ONLY_FLOOD:-}${ONLY_SPENDS:-}" ] || {
printf '%-6s %9s  %15s  %15s  %8s\n' mode in_flight backend_hits/s pgbench_hits/s ratio
for mode in fresh hot; do
  for c in 1 16 64; do
    reset_table
    ours=$("$bench" "$URL" "$schema" "$mode" "$c" "$SECS")
    reset_table
    theirs=$(ceiling "$mode" "$c")
    printf '%-6s %9s  %15.0f  %15.0f  %8.2f\n' "$mode" "$c" "$ours" "$theirs" "$(python3 -c "print($ours / $theirs)")"
  done
done
}

[ -n "${ONLY_FLOOD:-}" ] || {
echo
printf '%-8s %9s  %10s  %18s  %20s\n' route in_flight requests/s statements/request transactions/request
for mode in cost charged; do
  for c in 1 16 64; do
    reset_table
    read -r rps per_request xacts < <("$bench" "$URL" "$schema" "$mode" "$c" "$SECS")
    printf '%-8s %9s  %10.0f  %18s  %20s\n' "$mode" "$c" "$rps" "$per_request" "$xacts"
  done
done
}
[ -n "${ONLY_SPENDS:-}" ] && exit 0

echo
reset_table
"$bench" "$URL" "$schema" flood 16 "${FLOOD_SECONDS:-$(( SECS * 2 ))}"
