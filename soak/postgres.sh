#!/usr/bin/env bash
# Soak: PostgreSQL, three faults under the load of four instances of a
# service. See soak/README.md.
#
# Against the server at $DATABASE_URL (default the machine's,
# postgres://postgres@127.0.0.1:5432/test), in a schema of its own that it
# drops at the end. $INSTANCES (4) processes of bench/src/bin/soak.rs, each a
# RateLimitLayer over PostgresBackend (a pool of its own, statement_timeout
# $STATEMENT_TIMEOUT_MS), send $RATE requests a second each for $DURATION
# seconds, through three faults, at 1/4, 2/4 and 3/4 of the run:
#   1. the server restarts ($PG_RESTART; by default pg_ctlcluster of the
#      newest cluster, which needs root or the cluster's owner);
#   2. pg_terminate_backend of every connection of the instances' pools,
#      $TERMINATE_ROUNDS (10) times, $TERMINATE_EVERY_MS (100) ms apart;
#   3. another session holds LOCK TABLE ... ACCESS EXCLUSIVE on the counters
#      table for $STALL_MS, longer than the statement timeout.
# The table is scanned for rows without a valid expiry $SCAN_AFTER seconds
# after each fault, and at the end. The report exits 1 on any
# over-admission, row without a valid expiry, or answer of 500. The server
# is checked to be up at the end (and started if it is not).
#
#   bash soak/postgres.sh
#   DURATION=60 STALL_MS=1000 bash soak/postgres.sh
#
# The restart restarts the whole server: every other client of it loses its
# connections too.
set -euo pipefail
cd "$(dirname "$0")/.."
. soak/common.sh
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export SCHEMA=tpw_soak_$$ APP_NAME=tpw-soak-$$
export STATEMENT_TIMEOUT_MS=${STATEMENT_TIMEOUT_MS:-250}
# The layer waits longer than the statement timeout, so that a stalled hit
# is ended by the server's timeout, as it would be with a remote database.
export LAYER_TIMEOUT_MS=${LAYER_TIMEOUT_MS:-500}
STALL_MS=${STALL_MS:-2000}
TERMINATE_ROUNDS=${TERMINATE_ROUNDS:-10} TERMINATE_EVERY_MS=${TERMINATE_EVERY_MS:-100}
SCAN_AFTER=${SCAN_AFTER:-10}
pg_version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
PG_RESTART=${PG_RESTART:-pg_ctlcluster --skip-systemctl-redirect $pg_version main restart}
PG_START=${PG_START:-pg_ctlcluster --skip-systemctl-redirect $pg_version main start}
command -v psql >/dev/null || { echo "psql not found (apt-get install postgresql-client)" >&2; exit 1; }
table="\"$SCHEMA\".\"tpw_counters\""

dir=$(mktemp -d)
psql_() { psql -X -q -v ON_ERROR_STOP=1 "$DATABASE_URL" "$@"; }
up() { for _ in $(seq 1 300); do psql_ -Atc 'SELECT 1' >/dev/null 2>&1 && return 0; sleep 0.1; done; return 1; }
cleanup() {
  stop_started
  if ! up; then echo "PostgreSQL is down: $PG_START" >&2; $PG_START || true; up || echo "PostgreSQL is still down" >&2; fi
  psql_ -c "DROP SCHEMA IF EXISTS \"$SCHEMA\" CASCADE" >/dev/null 2>&1 || true
  keep_run
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
up || { echo "no PostgreSQL at $DATABASE_URL" >&2; exit 1; }
build_soak
"$soak_bin" postgres-migrate

# Rows, rows without a valid expiry (none, not finite, or further than the
# window from now: a deadline is written once, at the hit's
# statement_timestamp() + window), and the most time a row has left. "Now"
# is clock_timestamp(), read after the scan's snapshot: a hit that began
# after the scan's statement_timestamp() and committed before its snapshot
# is rightly up to a window past the one, never past the other.
scan() { # name
  local out
  for _ in $(seq 1 100); do
    out=$(psql_ -Atc "SELECT count(*), count(*) FILTER (WHERE expires_at IS NULL OR NOT isfinite(expires_at)
        OR expires_at > clock_timestamp() + make_interval(secs => $WINDOW_MS / 1000.0)),
      coalesce(floor(extract(epoch FROM max(expires_at) - clock_timestamp()) * 1000), 0)::bigint FROM $table" 2>/dev/null | tr '|' ' ') && break
    out="-1 -1 -1"; sleep 0.1
  done
  echo "scan $(now_ms) $1 $out" >>"$dir/events"
}
fault() { echo "fault $(now_ms) $1" >>"$dir/events"; }
event() { echo "event $(now_ms) $1" >>"$dir/events"; }

echo "postgres soak: $INSTANCES instances x $RATE requests/s for $DURATION s, $KEYS keys, $LIMIT per $WINDOW_MS ms; statement_timeout ${STATEMENT_TIMEOUT_MS} ms, layer timeout ${LAYER_TIMEOUT_MS} ms"
: >"$dir/events"
start_instances postgres
start=$(( END_MS - DURATION * 1000 ))
at() { sleep_until $(( start + DURATION * 1000 * $1 / 4 )); }

at 1
fault server-restart
$PG_RESTART
event restart-command-returned
up
sleep "$SCAN_AFTER"; scan after-restart

at 2
fault pg_terminate_backend
# A connection is busy only while its statement runs, so one round mostly
# ends idle connections; rounds $TERMINATE_EVERY_MS apart also catch
# statements in flight, and connections the pools have just made again.
n=0
for _ in $(seq 1 "$TERMINATE_ROUNDS"); do
  n=$(( n + $(psql_ -Atc "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '$APP_NAME'") ))
  last_round=$(now_ms)
  sleep "$(awk "BEGIN { print $TERMINATE_EVERY_MS / 1000 }")"
done
echo "event $last_round last-round" >>"$dir/events"
echo "pg_terminate_backend: $n connections in $TERMINATE_ROUNDS rounds"
sleep "$SCAN_AFTER"; scan after-terminate

at 3
fault "lock-table-${STALL_MS}ms"
psql_ -c "BEGIN; LOCK TABLE $table IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep($STALL_MS / 1000.0); COMMIT;" >/dev/null
event lock-released
sleep "$SCAN_AFTER"; scan after-stall

wait_instances || failed=1
scan end
"$soak_bin" report "$dir/events" "$dir"/answers.* && [ -z "${failed:-}" ]
