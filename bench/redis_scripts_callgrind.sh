#!/usr/bin/env bash
# Redis' instructions per request inside the crate's scripts, under
# valgrind's callgrind: a redis-server of its own (on a free port of
# 127.0.0.1) runs the same calls for each script, as the lanes send them,
# 300 calls of 32 requests over 2,000 keys (a few new, most existing), and
# the instructions inside `evalGenericCommand` are divided by the requests:
#   hit_batch   a hit on one counter per request (the plain route)
#   spend       a spend of 1 on one counter per request (the cost route)
#   spend-check a check (a spend of 0) on one counter per request
#   spend-hot   a spend of 1 on one key for every request, a limit of
#               5,000 (the first half of the calls admit, the rest deny)
#   slots       a slot in flight per request (the in-flight route): a call
#               of 32 takes (`slots_batch.lua`, a cap of 1,000 no key
#               reaches), then a call of their 32 give-backs, as the lanes
#               send them (a request gives back after its take's answer);
#               a request is its take and its give-back
# (Hits on one key need no such case: the lanes send them as one entry.)
# A count, not a time: it repeats from run to run to within a few
# instructions, whatever else the machine does.
#
#   bash bench/redis_scripts_callgrind.sh
#
# Needs valgrind, redis-server, redis-cli and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in valgrind callgrind_annotate redis-server redis-cli python3; do
  command -v "$bin" >/dev/null || { echo "$bin not found" >&2; exit 1; }
done
CALLS=300 PER_CALL=32

# The calls of one case, one per line, for redis-cli: $1 = case, $2 = sha.
calls() {
  python3 - "$1" "$2" "$CALLS" "$PER_CALL" <<'PY'
import random, sys
case, sha, calls, per = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
random.seed(1)
for _ in range(calls):
    hot = case.endswith('-hot')
    keys = ['tpw:b{hot}' if hot else 'tpw:b{k%d}' % random.randrange(2000) for _ in range(per)]
    if case == 'slots':
        # Half the calls: the takes of one call, then their give-backs.
        if _ % 2:
            continue
        records = [k + ':slots' for k in keys]
        slots = ['%032x' % random.getrandbits(128) for _ in keys]
        for spec in ('"1000 60000"', '-'):
            args = [a for slot in slots for a in (slot, spec)]
            print(' '.join(['EVALSHA', sha, str(len(records))] + records + args))
        continue
    if case == 'hit_batch':
        args = [a for _ in keys for a in ('1', '60000')]
        print(' '.join(['EVALSHA', sha, str(len(keys))] + keys + args))
    else:
        cost = '0' if case == 'spend-check' else '1'
        ks = [x for k in keys for x in (k, k + ':lock')]
        limit = '5000' if hot else '1000000000'
        args = ['"1 %s 0 0 %s 60000"' % (cost, limit)] * len(keys)
        print(' '.join(['EVALSHA', sha, str(len(ks))] + ks + args))
PY
}

one() { # $1 = case, $2 = script file: prints instructions per request
  local dir port vg sha ir
  dir=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    >"$dir/log" 2>&1 &
  vg=$!
  for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  sha=$(redis-cli -p "$port" script load "$(cat "$2")")
  calls "$1" "$sha" | redis-cli -p "$port" >"$dir/replies"
  if grep -q '^ERR' "$dir/replies"; then
    echo "$1: a call failed: $(grep -m1 '^ERR' "$dir/replies")" >&2
    exit 1
  fi
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$vg" || true
  ir=$(callgrind_annotate --inclusive=yes "$dir/callgrind.out" 2>/dev/null |
    grep -E ':evalGenericCommand ' | head -n 1 | awk '{gsub(",", "", $1); print $1}')
  rm -rf "$dir"
  [ -n "$ir" ] || { echo "no count for $1" >&2; exit 1; }
  # A slots request is two steps, in two of the calls.
  local requests=$((CALLS * PER_CALL))
  [ "$1" = slots ] && requests=$((requests / 2))
  python3 -c "print('%-12s %12.0f' % ('$1', $ir / $requests))"
}

# The slots' batch script is sent as the crate sends it: the record's
# shared text, then its own.
slots_batch=$(mktemp)
trap 'rm -f "$slots_batch"' EXIT
cat redis/src/slots.lua redis/src/slots_batch.lua >"$slots_batch"

printf '%-12s %12s\n' case redis_ir/request
one hit_batch redis/src/hit_batch.lua
one spend redis/src/spend.lua
one spend-check redis/src/spend.lua
one spend-hot redis/src/spend.lua
one slots "$slots_batch"
