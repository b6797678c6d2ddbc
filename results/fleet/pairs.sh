#!/usr/bin/env bash
# results/fleet/pairs.sh A_BIN B_BIN [ROW]: two tollgate-server builds on one results/fleet row,
# in interleaved pairs (A B, then B A, ...), for a change whose effect is smaller than this
# machine's drift between runs. Per run: a fresh redis-server and server, rls-load at STREAMS
# streams (the row's three descriptors, as run.sh sends them) for WARMUP then DURATION, and the
# server's system calls over the window (`perf stat` on the syscalls tracepoints; no slowdown
# worth counting, unlike strace). Prints one line per run and, per measure, the median and range
# of the per-pair ratios B / A. ROW defaults to tollgate_lease; PAIRS (default 8), STREAMS (64),
# WARMUP (1s), DURATION (5s), OUT (default: a temporary directory; keeps each run's JSON);
# B_CONFIG: a config file for B's runs instead of the row's (A and B may then be one binary).
set -euo pipefail
cd "$(dirname "$0")/../.."
a_bin=$(realpath "$1") b_bin=$(realpath "$2") row=${3:-tollgate_lease}
pairs=${PAIRS:-8} streams=${STREAMS:-64} warmup=${WARMUP:-1s} duration=${DURATION:-5s}
out=${OUT:-$(mktemp -d)}
b_config=$(realpath "${B_CONFIG:-results/fleet/$row.toml}")
mkdir -p "$out"
load_bin=target/release/rls-load
[ -x "$load_bin" ] || cargo build --release -p tollgate-lab --bin rls-load --locked
syscalls=writev,write,recvfrom,epoll_wait
events=$(echo "$syscalls" | sed 's/\([a-z_]*\)/syscalls:sys_enter_\1/g')
source results/fleet/common.sh

echo "# $(date -u +%FT%TZ) nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# A $a_bin ($(sha256sum "$a_bin" | cut -c1-12)), B $b_bin ($(sha256sum "$b_bin" | cut -c1-12)), row $row, $pairs pairs, $streams streams, $warmup + $duration"
[ -n "${B_CONFIG:-}" ] && echo "# B's config: $B_CONFIG: $(grep -E '^lease|^mode' "$b_config" | tr '\n' ' ')"
echo "# run bin calls/s server_us/call p50_us p99_us p999_us $(echo $syscalls | tr , ' ') (system calls per call)"

one() { # one run: $1 = label, $2 = binary, $3 = run number, $4 = config (with its Redis URL to fill)
  local port redis_pid server_pid grpc config=$out/$3.toml
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$out/$3.redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  sed "s#REDIS_URL_PLACEHOLDER#redis://127.0.0.1:$port/#" "$4" >"$config"
  "$2" --config "$config" --workers 1 >"$out/$3.server.out" 2>"$out/$3.server.log" &
  server_pid=$!
  for _ in $(seq 100); do
    grpc=$(sed -n 's/^grpc listening on //p' "$out/$3.server.out")
    [ -n "$grpc" ] && break
    sleep 0.1
  done
  "$load_bin" --target "http://$grpc" --domain edge --streams "$streams" --channels 2 --threads 1 \
    --client h2 --keys 100 "${descriptors[@]}" --server-pid "$server_pid" \
    --warmup "$warmup" --duration "$duration" --json "$out/$3.json" >/dev/null 2>&1 &
  local load_pid=$!
  sleep "${warmup%s}"
  perf stat -x, -e "$events" -p "$server_pid" -o "$out/$3.syscalls" -- sleep "${duration%s}" >/dev/null 2>&1
  wait "$load_pid"
  kill "$server_pid" "$redis_pid"
  wait "$server_pid" "$redis_pid" 2>/dev/null || true
  python3 - "$1" "$out/$3.json" "$out/$3.syscalls" "${duration%s}" <<'EOF'
import json, sys
label, path, sc, window = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
d = json.load(open(path))
l = d["latency_us"]
counts = [int(line.split(",")[0]) for line in open(sc) if "syscalls:" in line]
per_call = " ".join(f"{c / (d['calls_per_s'] * window):.3f}" for c in counts)
print(f"{label} {d['calls_per_s']:.0f} {d['server_cpu']['us_per_call']:.1f} {l['p50']:.0f} "
      f"{l['p99']:.0f} {l['p999']:.0f} {per_call}")
EOF
}

lines=$out/lines.txt
: >"$lines"
for p in $(seq "$pairs"); do
  if [ $((p % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for x in $order; do
    if [ "$x" = A ]; then bin=$a_bin conf=results/fleet/$row.toml; else bin=$b_bin conf=$b_config; fi
    echo "$p $(one "$x" "$bin" "$p$x" "$conf")" | tee -a "$lines"
  done
done
python3 - "$lines" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    p, label, *v = line.split()
    runs.setdefault(p, {})[label] = [float(x) for x in v]
names = ["calls/s", "server us/call", "p50", "p99", "p99.9", "writev", "write", "recvfrom", "epoll_wait"]
print("# per-pair ratio B / A: median (range)")
for i, name in enumerate(names):
    r = [ab["B"][i] / ab["A"][i] for ab in runs.values() if ab["A"][i] > 0]
    if r:
        print(f"{name}: {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})")
EOF
