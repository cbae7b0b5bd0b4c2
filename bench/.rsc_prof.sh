set -euo pipefail
cd "$(dirname "$0")/.."
source <(sed -n '/^CALLS=/,/^}/p' bench/redis_scripts_callgrind.sh)
dir=/tmp/cg_slots; rm -rf $dir; mkdir -p $dir
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$dir/log" 2>&1 &
vg=$!
for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
cat redis/src/slots.lua redis/src/slots_batch.lua > $dir/script.lua
sha=$(redis-cli -p "$port" script load "$(cat $dir/script.lua)")
calls slots "$sha" | redis-cli -p "$port" >"$dir/replies"
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$vg" || true
