#!/usr/bin/env bash
# Instructions per request in the quickstart-style server under valgrind's
# callgrind, driven by wrk: without a layer (off), with a layer that does
# nothing (identity: what axum's route_layer costs by itself), without a
# layer but writing the layer's two headers as constants (static-headers:
# what sending those headers costs), with the layer but no headers
# (noheaders), and with the layer (on). The counts repeat from run to run
# where wrk's wall-clock requests/s swing by ±15%. Each includes the
# server's start-up spread over the run's requests (for the layer, about
# 16 million instructions calibrating its clock: 300 to 400 a request).
#
#   bash bench/wrk_callgrind.sh
#   MODES="off on" SECONDS_PER_CASE=8 bash bench/wrk_callgrind.sh
#
# Needs valgrind and wrk (Debian: apt-get install valgrind wrk).
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in valgrind callgrind_annotate wrk curl python3 taskset; do
  command -v "$bin" >/dev/null || { echo "$bin not found" >&2; exit 1; }
done
SECS=${SECONDS_PER_CASE:-8}
PORT=${PORT:-3919}

cargo build --release -p tower-pinned-window-bench --bin wrk_server --quiet
server="${CARGO_TARGET_DIR:-target}"/release/wrk_server

printf '%-16s %10s %14s\n' mode requests instr/request
for mode in ${MODES:-off identity static-headers noheaders on}; do
  out=$(mktemp)
  LIMIT=$mode PORT=$PORT taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$out" "$server" >/dev/null 2>&1 &
  vg=$!
  for _ in $(seq 150); do curl -fs "http://127.0.0.1:$PORT/" >/dev/null 2>&1 && break; sleep 0.2; done
  requests=$(taskset -c 1 wrk -t1 -c64 -d"${SECS}s" "http://127.0.0.1:$PORT/" | awk '/requests in/ {print $1}')
  # SIGTERM: valgrind writes the profile on it (the server ignores nothing).
  kill -TERM "$vg"; wait "$vg" 2>/dev/null || true
  total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  rm -f "$out"
  [ -n "$total" ] && [ "${requests:-0}" -gt 0 ] || { echo "no count for $mode" >&2; exit 1; }
  # +1: the readiness probe's request.
  python3 -c "print('%-16s %10d %14.0f' % ('$mode', $requests, $total / ($requests + 1)))"
done
