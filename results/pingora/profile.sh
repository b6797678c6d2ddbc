#!/usr/bin/env bash
# A cpu-clock profile of the proxy in one mode under wrk (the run's setup), for issue 16's point
# about per-request allocations:  results/pingora/profile.sh [MODE] [KEYS]   (default: policy 1000000)
# Writes results/pingora/raw/profile-MODE-kKEYS.txt (perf report, flat, by symbol).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-policy}
KEYS=${2:-1000000}
LOCK=${LOCK:-/work/bench.lock}
BIN=target/release/pingora-bench
OUT=results/pingora/raw/profile-$MODE-k$KEYS.txt
nice -n 15 cargo build -p tollgate-lab --release --bin pingora-bench --locked
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done; return 1; }
UP=$(free_port); PX=$(free_port)
"$BIN" upstream --listen "127.0.0.1:$UP" >/dev/null & UP_PID=$!
wait_http "http://127.0.0.1:$UP/__counts"
"$BIN" proxy --listen "127.0.0.1:$PX" --upstream "127.0.0.1:$UP" --limiter "$MODE" \
  --capacity "$(( KEYS > 1024 ? KEYS : 1024 ))" >/dev/null 2>&1 & PROXY_PID=$!
trap 'kill -INT $PROXY_PID 2>/dev/null; kill $UP_PID 2>/dev/null; wait' EXIT
wait_http "http://127.0.0.1:$PX/"
flock "$LOCK" bash -c "KEYS=$KEYS THREADS=2 wrk -t2 -c16 -d8s -s results/pingora/keys.lua http://127.0.0.1:$PX/ >/dev/null &
  sleep 1; perf record -q -e cpu-clock -g -p $PROXY_PID -o /tmp/tollgate-pingora-perf.data -- sleep 6; wait"
{
  echo "mode=$MODE keys=$KEYS commit=$(git rev-parse --short HEAD) date=$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "command: perf record -e cpu-clock -g -p <proxy> -- sleep 6 (under wrk -t2 -c16, keys.lua KEYS=$KEYS)"
  perf report -i /tmp/tollgate-pingora-perf.data --no-children --sort symbol --stdio 2>/dev/null \
    | grep -v '^$' | grep -E '^ +[0-9]' | head -60
} >"$OUT"
cat "$OUT"
