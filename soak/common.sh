# Shared by the soaks in soak/ (sourced, not run): the
# load program, the clock, the processes to stop at the end.

# The settings of the load and the quota, read by every instance and by the
# report (bench/src/bin/soak.rs).
export KEYS=${KEYS:-50} LIMIT=${LIMIT:-20} WINDOW_MS=${WINDOW_MS:-2000}
export RATE=${RATE:-500} WORKERS=${WORKERS:-16}
DURATION=${DURATION:-120}     # seconds of load
INSTANCES=${INSTANCES:-4}

now_ms() { date +%s%3N; }
# Sleep until $1 (Unix milliseconds).
sleep_until() {
  local left=$(( $1 - $(now_ms) ))
  if [ "$left" -gt 0 ]; then sleep "$(awk "BEGIN { print $left / 1000 }")"; fi
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Every process this soak starts, stopped (by its id) and reaped at exit.
started=()
stop_started() {
  local pid
  for pid in "${started[@]}"; do
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  started=()
}

# With KEEP set, copy the run's answers and events (and the Cluster soak's
# slots of the keys, the outbound soak's provider log, the in-flight soak's
# looks at the store) there before they go.
keep_run() {
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP" && cp "$dir"/answers.* "$dir"/events "$KEEP"/ 2>/dev/null || true
    local f
    for f in slots provider watch; do
      if [ -f "$dir/$f" ]; then cp "$dir/$f" "$KEEP"/; fi
    done
  fi
}

# For a soak on Redis servers of its own: redis-server checked for, the run's
# temporary directory ($dir), every process stopped and the directory
# removed at exit, the soak program built ($soak_bin: bench/src/bin/$1.rs,
# soak.rs by default).
begin_redis_soak() {
  command -v redis-server >/dev/null || { echo "redis-server not found (apt-get install redis-server)" >&2; exit 1; }
  dir=$(mktemp -d)
  trap 'stop_started; keep_run; rm -rf "$dir"' EXIT
  trap 'exit 130' INT TERM
  build_soak "${1:-soak}"
}

build_soak() { # [bin]
  local bin=${1:-soak}
  cargo build --release -p tower-pinned-window-bench --bin "$bin" --features cluster --quiet
  soak_bin=${CARGO_TARGET_DIR:-target}/release/$bin
}

# Start $INSTANCES instances of $1 (sentinel, postgres) until END_MS, each
# writing its answers to $dir/answers.N; their ids in $instances.
start_instances() {
  export END_MS=$(( $(now_ms) + DURATION * 1000 ))
  instances=()
  local i
  for i in $(seq 1 "$INSTANCES"); do
    RUST_LOG=${RUST_LOG:-error} "$soak_bin" "$1" "$i" "$dir/answers.$i" &
    started+=("$!")
    instances+=("$!")
  done
}

# Wait for the instances; 1 when one of them failed.
wait_instances() {
  local pid failed=0
  for pid in "${instances[@]}"; do
    wait "$pid" || { echo "instance $pid failed" >&2; failed=1; }
  done
  return $failed
}

# Start a standalone redis-server on $port (again, after a kill: same port),
# without persistence, in $dir; its id in $redis_pid. Exits when it does not
# answer PING within 10 s.
redis_pid=
start_redis() {
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir" --logfile "$dir/redis.log" &
  redis_pid=$!
  started+=("$redis_pid")
  local i
  for i in $(seq 1 200); do
    [ "$(redis-cli -h 127.0.0.1 -p "$port" PING 2>/dev/null)" = PONG ] && return 0
    sleep 0.05
  done
  echo "redis-server on $port did not answer; log:" >&2
  tail -n 20 "$dir/redis.log" >&2
  exit 1
}

# Scan the Redis on port $2 for the run's counters (under $PREFIX): how
# many, those without an expiry or with one longer than the window (PTTL
# -1, or above WINDOW_MS), and the longest PTTL, in one atomic script; the
# line goes to $dir/events as `scan UNIX_MS $1 COUNTERS BAD LONGEST`. A
# spend call's marker (the Redis backend's `...:lost:<hex>` keys, which keep
# a spend's answers for the give-back of a lost reply) is not a counter:
# it is counted as bad only without an expiry or past its own lifetime,
# MARKER_MS (5,000 ms).
MARKER_MS=${MARKER_MS:-5000}
scan_redis() { # name port
  local out
  out=$(redis-cli -h 127.0.0.1 -p "$2" EVAL "local n, bad, longest = 0, 0, 0
    for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
      local t = redis.call('PTTL', k)
      if string.find(k, ':lost:%x+$') then
        if t < 0 or t > tonumber(ARGV[3]) then bad = bad + 1 end
      else
        n = n + 1
        if t < 0 or t > tonumber(ARGV[2]) then bad = bad + 1 end
        if t > longest then longest = t end
      end
    end
    return {n, bad, longest}" 0 "$PREFIX*" "$WINDOW_MS" "$MARKER_MS" | tr '\n' ' ') || out="-1 -1 -1"
  echo "scan $(now_ms) $1 $out" >>"$dir/events"
}
