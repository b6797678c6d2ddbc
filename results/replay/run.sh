#!/usr/bin/env bash
# Replay throughput on one core for a 3-rule config (three-rules.toml).
# Usage: results/replay/run.sh [keys] [rate per key] [seconds]   (default: 1000 x 100/s x 50 s = 5 M lines)
# Writes the traffic to a temporary file (about 75 bytes a line), replays it once to warm the page
# cache and then RUNS times (default 5) pinned to CPU (default: the last one), prints each run's
# rate as the command reports it and their median (the figure), and the
# user-space instructions per request: with perf where it counts them, else (no PMU, as on the
# KVM machines here) with valgrind's callgrind over the first 1 M lines of the same shape (keys x
# rate x 10 s), less an empty replay's count (CALLGRIND=0 skips it: about a minute). Instruction
# counts do not depend on the machine's load; the rate does: run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
KEYS="${1:-1000}"; RATE="${2:-100}"; SECONDS_="${3:-50}"
CPU="${CPU:-$(( $(nproc) - 1 ))}"; RUNS="${RUNS:-5}"
cargo build --release -p tollgate-replay --bin tollgate
BIN="${CARGO_TARGET_DIR:-target}/release/tollgate"

DIR="$(mktemp -d)"; trap 'rm -rf "$DIR"' EXIT
"$BIN" generate --keys "$KEYS" --rate "$RATE" --seconds "$SECONDS_" > "$DIR/traffic.jsonl"
LINES=$(wc -l < "$DIR/traffic.jsonl")
echo "traffic: $LINES lines, $(du -h "$DIR/traffic.jsonl" | cut -f1)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); commit $(git rev-parse --short HEAD); $(date -u +%FT%TZ)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); pinned to CPU $CPU"
taskset -c "$CPU" "$BIN" replay --config results/replay/three-rules.toml \
  --svg "$DIR/timeline.svg" "$DIR/traffic.jsonl" > "$DIR/report.txt" 2> "$DIR/warm.txt"
echo "warm-up: $(cat "$DIR/warm.txt")"
for _ in $(seq "$RUNS"); do
  taskset -c "$CPU" "$BIN" replay --config results/replay/three-rules.toml "$DIR/traffic.jsonl" \
    2>&1 > /dev/null | tee -a "$DIR/runs.txt"
done
echo "median of $RUNS: $(grep -o '[0-9.]* M requests/s' "$DIR/runs.txt" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }') M requests/s"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
INSNS=""
if perf stat -e instructions:u -x, -o "$DIR/perf.csv" -- \
     taskset -c "$CPU" "$BIN" replay --config results/replay/three-rules.toml "$DIR/traffic.jsonl" > /dev/null 2>&1; then
  INSNS=$(grep instructions "$DIR/perf.csv" | cut -d, -f1)
  if [[ "$INSNS" =~ ^[0-9]+$ ]]; then
    echo "instructions:u per request (perf, whole process, generation excluded): $(( INSNS / LINES ))"
  else
    echo "perf: instructions not counted here ($INSNS)"
    INSNS=""
  fi
fi
if [[ -z "$INSNS" && "${CALLGRIND:-1}" != 0 ]] && command -v valgrind > /dev/null; then
  # Callgrind's Ir: user-space instructions, deterministic for a given binary and trace.
  ir() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null -- \
      "$BIN" replay --config results/replay/three-rules.toml "$1" 2>&1 > /dev/null |
      sed -n 's/.*refs: *//p' | tr -d ,
  }
  "$BIN" generate --keys "$KEYS" --rate "$RATE" --seconds 10 > "$DIR/short.jsonl"
  : > "$DIR/empty.jsonl"
  SHORT=$(wc -l < "$DIR/short.jsonl")
  FULL=$(ir "$DIR/short.jsonl"); EMPTY=$(ir "$DIR/empty.jsonl")
  echo "instructions per request (callgrind Ir over $SHORT lines of the same shape, less an empty replay's $EMPTY): $(( (FULL - EMPTY) / SHORT ))"
fi
head -20 "$DIR/report.txt"
