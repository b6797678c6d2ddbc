#!/usr/bin/env bash
# Tollgate inside Pingora, side by side with pingora-limits (issue 16 point 3).
#
#   results/pingora/run.sh            # whole run, about 13-14 minutes on 2 cores (+ build)
#   DUR=2 REPS=1 ACC_DUR=3 results/pingora/run.sh   # a quick smoke run
#   MICRO=1 results/pingora/run.sh    # also `bench decide` (in-process cost) into raw/micro-run.txt
#
# For each run a fresh upstream and a fresh proxy (`crates/lab/src/bin/pingora-bench.rs`, release) are
# started on free loopback ports, wrk loads the proxy through keys.lua, the proxy's VmRSS/VmHWM are
# read from /proc, the upstream's per-key counts are fetched, and both are stopped by PID.
#
# perf runs:  every mode x KEYSETS x CONNS x REPS, DUR seconds each, limits far above the offered
#             load (every request admitted), so every mode does the same proxy work plus its
#             decision; the rounds rotate the modes' order.
# accuracy:   limited modes x KEYSETS x ACC_LIMITS per key per second, ACC_DUR seconds at ACC_CONNS
#             connections; the upstream's counts say how many requests each key got through.
#
# Raw output goes to results/pingora/raw/, the tables to results/pingora/tables.md
# (summarize.py). wrk runs under `flock /work/bench.lock` (held per run, only while measuring).
set -euo pipefail
cd "$(dirname "$0")/../.."

DUR=${DUR:-4}
REPS=${REPS:-3}
CONNS=${CONNS:-"1 16 128"}
KEYSETS=${KEYSETS:-"1 10000 1000000"}
MODES=${MODES:-"none pingora-limits keyed policy"}
ACC_MODES=${ACC_MODES:-"pingora-limits keyed policy"}
ACC_LIMITS=${ACC_LIMITS:-"1 10"}
ACC_DUR=${ACC_DUR:-8}
ACC_CONNS=${ACC_CONNS:-16}
THREADS=2          # wrk threads
PROXY_THREADS=2    # Pingora worker threads
LOCK=${LOCK:-/work/bench.lock}
HERE=results/pingora
RAW=${RAW:-$HERE/raw}
BIN=target/release/pingora-bench

nice -n 15 cargo build -p tollgate-lab --release --bin pingora-bench --locked
mkdir -p "$RAW"
rm -f "$RAW"/perf-* "$RAW"/acc-*   # this script's own files only (micro-*, profile-* stay)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_http() { # url: poll until it answers (bounded: 10 s)
  for _ in $(seq 100); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "no answer from $1" >&2
  return 1
}

UP_PID="" PROXY_PID=""
stop() {
  # SIGINT: Pingora's fast shutdown (SIGTERM waits for its graceful period).
  if [ -n "$PROXY_PID" ]; then kill -INT "$PROXY_PID" 2>/dev/null || true; wait "$PROXY_PID" 2>/dev/null || true; fi
  if [ -n "$UP_PID" ]; then kill "$UP_PID" 2>/dev/null || true; wait "$UP_PID" 2>/dev/null || true; fi
  UP_PID="" PROXY_PID=""
}
trap stop EXIT

# run_one OUTFILE MODE KEYS CONNS SECONDS LIMIT
run_one() {
  local out=$1 mode=$2 keys=$3 conns=$4 secs=$5 limit=$6
  local capacity=$(( keys > 1024 ? keys : 1024 ))
  local threads=$(( conns < THREADS ? conns : THREADS ))  # wrk needs connections >= threads
  local up_port proxy_port
  up_port=$(free_port)
  proxy_port=$(free_port)
  "$BIN" upstream --listen "127.0.0.1:$up_port" --max-keys 1000000 >/dev/null &
  UP_PID=$!
  wait_http "http://127.0.0.1:$up_port/__counts"
  "$BIN" proxy --listen "127.0.0.1:$proxy_port" --upstream "127.0.0.1:$up_port" \
    --limiter "$mode" --limit "$limit" --capacity "$capacity" --threads "$PROXY_THREADS" \
    >"$out.proxy.log" 2>&1 &
  PROXY_PID=$!
  wait_http "http://127.0.0.1:$proxy_port/"
  {
    echo "mode=$mode keys=$keys conns=$conns secs=$secs limit=$limit capacity=$capacity"
    echo "command: KEYS=$keys THREADS=$threads wrk -t$threads -c$conns -d${secs}s --latency -s $HERE/keys.lua http://127.0.0.1:$proxy_port/"
    echo "date: $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "rss_before_kb=$(awk '/^VmRSS/{print $2}' /proc/$PROXY_PID/status)"
  } >"$out"
  KEYS=$keys THREADS=$threads flock "$LOCK" \
    wrk -t"$threads" -c"$conns" -d"${secs}s" --latency -s "$HERE/keys.lua" \
    "http://127.0.0.1:$proxy_port/" >>"$out" 2>&1
  {
    echo "rss_after_kb=$(awk '/^VmRSS/{print $2}' /proc/$PROXY_PID/status)"
    echo "hwm_kb=$(awk '/^VmHWM/{print $2}' /proc/$PROXY_PID/status)"
    echo "--- upstream counts"
    curl -s "http://127.0.0.1:$up_port/__counts"
  } >>"$out"
  stop
  grep '^RESULT' "$out" | sed "s|^|$mode k=$keys c=$conns L=$limit |"
}

{
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (+ uncommitted changes)')"
  echo "date: $(date -u +%FT%TZ)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "wrk: $(wrk -v 2>&1 | head -1)"
  echo "load at start: $(cat /proc/loadavg)"
} >"$RAW/machine.txt"
cat "$RAW/machine.txt"

for rep in $(seq "$REPS"); do
  # Rotate the modes' order each round so slow drift of the shared machine spreads over all.
  read -r -a modes <<<"$MODES"
  n=${#modes[@]}
  for keys in $KEYSETS; do
    for conns in $CONNS; do
      for i in $(seq 0 $((n - 1))); do
        mode=${modes[$(((i + rep - 1) % n))]}
        run_one "$RAW/perf-$mode-k$keys-c$conns-r$rep.txt" "$mode" "$keys" "$conns" "$DUR" 1000000000
      done
    done
  done
done

for limit in $ACC_LIMITS; do
  for keys in $KEYSETS; do
    for mode in $ACC_MODES; do
      run_one "$RAW/acc-$mode-k$keys-L$limit.txt" "$mode" "$keys" "$ACC_CONNS" "$ACC_DUR" "$limit"
    done
  done
done

if [ "${MICRO:-0}" = 1 ]; then
  # The in-process decision cost (bench decide), about 40 s more.
  { echo "command: $BIN decide --iters 1000000 (under flock $LOCK)"
    echo "commit: $(git rev-parse --short HEAD); date: $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    flock "$LOCK" "$BIN" decide --iters 1000000; } >"$RAW/micro-run.txt"
fi

echo "load at end: $(cat /proc/loadavg)" >>"$RAW/machine.txt"
TABLES=${TABLES:-$HERE/tables.md}
python3 "$HERE/summarize.py" "$RAW" >"$TABLES"
cat "$TABLES"
