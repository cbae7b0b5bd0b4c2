#!/usr/bin/env bash
# Requests per second through the quickstart-style server without the layer,
# with it, and with it but no RateLimit headers, measured in the same run,
# and the ratios to the server without it; and, for scale, the server without
# the layer writing the layer's two headers as constants (what sending those
# bytes costs by itself).
#
#   bash bench/wrk.sh            # 3 rounds of 10 s each way
#   ROUNDS=5 DURATION=20s bash bench/wrk.sh
#   BOOK=1 bash bench/wrk.sh     # and the layer with its limit held in the
#                                # store (LIMIT=book), its ratio to the layer
#
# Needs wrk (Debian: apt-get install wrk). Only 127.0.0.1 is loaded.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 1; }

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-1}
CONNECTIONS=${CONNECTIONS:-64}
PORT=${PORT:-3917}

cargo build --release -p tower-pinned-window-bench --bin wrk_server --quiet
server="${CARGO_TARGET_DIR:-target}"/release/wrk_server

run() { # $1 = LIMIT (on, off, noheaders, static-headers, book); prints requests/s
  LIMIT=$1 PORT=$PORT taskset -c 0 "$server" >/dev/null &
  local pid=$!
  for _ in $(seq 50); do curl -fs "http://127.0.0.1:$PORT/" >/dev/null && break; sleep 0.1; done
  local rps
  rps=$(taskset -c 1 wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" "http://127.0.0.1:$PORT/" | awk '/Requests\/sec/ {print $2}')
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "$rps"
}

echo "round  without_layer_rps  with_layer_rps  ratio  no_headers_rps  ratio  static_headers_rps  ratio"
sum_off=0; sum_on=0; sum_bare=0; sum_static=0
for round in $(seq "$ROUNDS"); do
  off=$(run off); on=$(run on); bare=$(run noheaders); static=$(run static-headers)
  sum_off=$(echo "$sum_off + $off" | bc -l); sum_on=$(echo "$sum_on + $on" | bc -l); sum_bare=$(echo "$sum_bare + $bare" | bc -l)
  sum_static=$(echo "$sum_static + $static" | bc -l)
  printf '%5d  %17.0f  %14.0f  %5.3f  %14.0f  %5.3f  %18.0f  %5.3f\n' "$round" "$off" "$on" "$(echo "$on / $off" | bc -l)" "$bare" "$(echo "$bare / $off" | bc -l)" \
    "$static" "$(echo "$static / $off" | bc -l)"
done
printf 'total  %17.0f  %14.0f  %5.3f  %14.0f  %5.3f  %18.0f  %5.3f\n' "$sum_off" "$sum_on" "$(echo "$sum_on / $sum_off" | bc -l)" "$sum_bare" "$(echo "$sum_bare / $sum_off" | bc -l)" \
  "$sum_static" "$(echo "$sum_static / $sum_off" | bc -l)"

if [ "${BOOK:-0}" = 1 ]; then
  # The layer with its limit in the store, against the layer with its fixed
  # quota, interleaved in the same rounds.
  echo "round  with_layer_rps  book_rps  ratio"
  sum_on=0; sum_book=0
  for round in $(seq "$ROUNDS"); do
    on=$(run on); book=$(run book)
    sum_on=$(echo "$sum_on + $on" | bc -l); sum_book=$(echo "$sum_book + $book" | bc -l)
    printf '%5d  %14.0f  %8.0f  %5.3f\n' "$round" "$on" "$book" "$(echo "$book / $on" | bc -l)"
  done
  printf 'total  %14.0f  %8.0f  %5.3f\n' "$sum_on" "$sum_book" "$(echo "$sum_book / $sum_on" | bc -l)"
fi
