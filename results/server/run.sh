#!/usr/bin/env bash
# ShouldRateLimit calls/s and latency of tollgate-server, driven by tollgate-lab's RLS load client
# (`rls-load`), at 1 and 64 concurrent streams, REPS repetitions each.
#
# Usage: results/server/run.sh [ROW ...]     (from anywhere inside the repository)
#   ROW: NAME or NAME:KEYS, the config results/server/NAME.toml driven over KEYS distinct client
#   addresses (default KEYS). Default rows: embedded redis_per_request redis_lease
#   redis_lease:10000. A row whose config has REDIS_URL_PLACEHOLDER gets its own redis-server on
#   a free loopback port (--save "", stopped by PID) whose URL replaces it in a copy of the config.
# Env: DURATION (10s), WARMUP (2s), REPS (3), STREAMS ("1 64"), CHANNELS (2), THREADS (client
#   runtime threads, 1), CLIENT (h2 | tonic: the load client's kind, h2), WORKERS (the server's
#   runtime worker threads, 1; "" = one per core), KEYS (100), OUT (results/server/raw),
#   SERVER_BIN (the server binary; default the fresh build; the load client is always the fresh
#   build of rls-load).
#   The defaults give the server one core's worth of threads and the client the other: on 2
#   shared cores more threads than cores only add context switches (results/server/README.md).
#
# The release build runs first, niced and outside the lock; each load run holds
# /work/bench.lock (when that exists) so no other benchmark overlaps it. The server and the client
# run at normal priority on the same machine.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=results/server
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
REPS=${REPS:-3}
STREAMS=${STREAMS:-"1 64"}
CHANNELS=${CHANNELS:-2}
THREADS=${THREADS:-1}
CLIENT=${CLIENT:-h2}
WORKERS=${WORKERS-1}
KEYS=${KEYS:-100}
OUT=${OUT:-$here/raw}
mkdir -p "$OUT"

rows=("$@")
[ ${#rows[@]} -eq 0 ] && rows=(embedded redis_per_request redis_lease redis_lease:10000)

nice -n 15 cargo build --release -p tollgate-server -p tollgate-lab --bin tollgate-server --bin rls-load --locked
server_bin=${SERVER_BIN:-target/release/tollgate-server}
load_bin=target/release/rls-load

lock() {
  if [ -e /work/bench.lock ]; then flock /work/bench.lock "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

{
  echo "command: results/server/run.sh ${rows[*]} (DURATION=$DURATION WARMUP=$WARMUP REPS=$REPS STREAMS=\"$STREAMS\" CHANNELS=$CHANNELS THREADS=$THREADS CLIENT=$CLIENT WORKERS=\"$WORKERS\" KEYS=$KEYS)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (+ uncommitted changes under crates/)')"
  echo "server binary: $server_bin ($(sha256sum "$server_bin" | cut -c1-12))"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /cpu: /'
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"

server_pid=""
redis_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null || true
  server_pid=""
  redis_pid=""
}
trap cleanup EXIT

# Repetitions outer, rows inner: each repetition runs every row once (a fresh redis-server and
# server each), so a change in the machine's load over the minutes hits every row alike.
for rep in $(seq "$REPS"); do
  for spec in "${rows[@]}"; do
    name=${spec%%:*}
    keys=$KEYS
    [ "$spec" != "$name" ] && keys=${spec#*:}
    row="$name-k$keys"
    config="$here/$name.toml"
    run_config="$OUT/$row.run.toml"
    cp "$config" "$run_config"
    other=()
    if grep -q 'REDIS_URL_PLACEHOLDER' "$config"; then
      port=$(free_port)
      redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$OUT/$row.redis.log" 2>&1 &
      redis_pid=$!
      for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
      sed -i "s#REDIS_URL_PLACEHOLDER#redis://127.0.0.1:$port/#" "$run_config"
      other=(--other-pid "$redis_pid")
    fi
    # Truncated here, not by the child's redirection: that may happen after the read below, which
    # would then find the previous repetition's address.
    : > "$OUT/$row.server.out"
    workers=()
    [ -n "$WORKERS" ] && workers=(--workers "$WORKERS")
    "$server_bin" --config "$run_config" "${workers[@]}" >>"$OUT/$row.server.out" 2>"$OUT/$row.server.log" &
    server_pid=$!
    grpc=""
    for _ in $(seq 100); do
      grpc=$(sed -n 's/^grpc listening on //p' "$OUT/$row.server.out")
      [ -n "$grpc" ] && break
      sleep 0.1
    done
    [ -n "$grpc" ] || { echo "server for $row did not start" >&2; cat "$OUT/$row.server.log" >&2; exit 1; }
    for streams in $STREAMS; do
      json="$OUT/$row-s$streams-r$rep.json"
      echo "== $row streams=$streams rep=$rep (load $(cut -d' ' -f1 /proc/loadavg))"
      lock "$load_bin" --target "http://$grpc" --domain edge --streams "$streams" \
        --channels "$CHANNELS" --threads "$THREADS" --client "$CLIENT" --keys "$keys" --server-pid "$server_pid" \
        "${other[@]}" --warmup "$WARMUP" --duration "$DURATION" --json "$json"
    done
    grep VmRSS "/proc/$server_pid/status" > "$OUT/$row-r$rep.server-rss.txt" || true
    cleanup
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

# Medians over the repetitions, one line per (row, streams).
python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, glob, os, statistics, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(out, "*-s*-r*.json"))):
    r = json.load(open(f))
    row = os.path.basename(f).rsplit("-s", 1)[0]
    runs.setdefault((row, r["streams"]), []).append(r)
print("| row | streams | reps | calls/s (median) | p50 µs | p99 µs | p99.9 µs | max µs | server CPU µs/call | redis-server CPU µs/call | client CPU µs/call | server+client cores | over_limit | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
cpu = lambda r, who: (r.get(who) or {}).get("us_per_call", float("nan"))
med = lambda rs, f: statistics.median(f(r) for r in rs)
fmt = lambda x: "—" if x != x else f"{x:.1f}"
for (row, streams), rs in sorted(runs.items()):
    print(f"| {row} | {streams} | {len(rs)} | {med(rs, lambda r: r['calls_per_s']):,.0f} "
          f"| {med(rs, lambda r: r['latency_us']['p50']):.0f} | {med(rs, lambda r: r['latency_us']['p99']):.0f} "
          f"| {med(rs, lambda r: r['latency_us']['p999']):.0f} | {med(rs, lambda r: r['latency_us']['max']):.0f} "
          f"| {fmt(med(rs, lambda r: cpu(r, 'server_cpu')))} | {fmt(med(rs, lambda r: cpu(r, 'other_cpu')))} | {fmt(med(rs, lambda r: cpu(r, 'client_cpu')))} "
          f"| {med(rs, lambda r: (r.get('server_cpu') or {}).get('cores', 0) + (r.get('client_cpu') or {}).get('cores', 0)):.2f} "
          f"| {sum(r['over_limit'] for r in rs)} of {sum(r['calls'] for r in rs)} | {sum(r['errors'] for r in rs)} |")
EOF
