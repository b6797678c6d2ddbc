#!/usr/bin/env bash
# results/fleet/instructions.sh SERVER_BIN ROW [CONFIG]: tollgate-server's instructions per call
# on a results/fleet row, by callgrind, which counts the same whatever this machine's load (its
# time measures do not). A fresh redis-server, the server under valgrind on ROW's config (or
# CONFIG, a config file with REDIS_URL_PLACEHOLDER for its Redis URL), rls-load at 64 streams with
# the row's three descriptors: 3 s of warm-up, the counters zeroed, then 10 s counted. Prints the
# instructions per call in all and in `LiveDomains::check` (the decision, without the gRPC and
# HTTP/2 work around it), with the functions named in FUNCS (a regex, default the Redis paths'
# steps) per call. Under valgrind the server answers a few thousand calls per second, so a lease
# TTL of 100 ms expires every few calls: give the lease row a CONFIG with long leases to count
# the local path alone. Needs valgrind; OUT (default a temporary directory) keeps the raw output.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "$1") row=$2 config=${3:-results/fleet/$2.toml}
funcs=${FUNCS:-'pass_async::\{\{closure\}\} \[|LeasedLimiter<C,K>::run::\{\{closure\}\} \[|conclude_async \[|key_after \[|key_name \['}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
load_bin=target/release/rls-load
[ -x "$load_bin" ] || cargo build --release -p tollgate-lab --bin rls-load --locked
source results/fleet/common.sh
port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$out/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
sed "s#REDIS_URL_PLACEHOLDER#redis://127.0.0.1:$port/#" "$config" >"$out/run.toml"
valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" "$bin" --config "$out/run.toml" \
  --workers 1 >"$out/server.out" 2>"$out/server.log" &
vg_pid=$!
trap 'kill $vg_pid $redis_pid 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  grpc=$(sed -n 's/^grpc listening on //p' "$out/server.out")
  [ -n "$grpc" ] && break
  sleep 0.1
done
load() {
  "$load_bin" --target "http://$grpc" --domain edge --streams 64 --channels 2 --threads 1 \
    --client h2 --keys 100 "${descriptors[@]}" --warmup 0s --duration "$1" --json "$out/load.json" \
    >/dev/null 2>&1
}
load 3s
callgrind_control -z "$vg_pid" >/dev/null 2>&1
load 10s
callgrind_control -d "$vg_pid" >/dev/null 2>&1
sleep 1
calls=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['calls'])" "$out/load.json")
dump=$(ls -t "$out"/cg.*.1 | head -1)
callgrind_annotate --inclusive=yes "$dump" >"$out/inclusive.txt" 2>/dev/null
echo "# $(date -u +%FT%TZ) $bin ($(sha256sum "$bin" | cut -c1-12)), row $row, config $config, $calls calls counted"
python3 - "$out/inclusive.txt" "$calls" "$funcs" <<'EOF'
import re, sys
text, calls, funcs = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[3]
def count(pattern):
    for line in text.splitlines():
        if re.search(pattern, line):
            return int(line.split()[0].replace(",", "")), line
    return 0, ""
total, _ = count(r"PROGRAM TOTALS")
print(f"all: {total // calls} instructions per call")
check, _ = count(r"LiveDomains::check::\{\{closure\}\} \[")
print(f"LiveDomains::check: {check // calls}")
for pattern in funcs.split("|"):
    n, line = count(pattern)
    if n:
        name = re.search(r":([^ :][^[]*) \[", line)
        print(f"  {(name.group(1) if name else pattern)[-70:]}: {n // calls}")
EOF
