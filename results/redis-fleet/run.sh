#!/usr/bin/env bash
# Fleet accuracy with 4 separate processes sharing one quota (per-request GCRA, fixed window, lease
# mode) at demand 0.5x, 1x and 4x, on a single redis-server and on a 3+3 Redis Cluster (started by the
# benchmark on free loopback ports), in real time.
# Usage: results/redis-fleet/run.sh   (from anywhere inside the repository)
# Env: SECS (5 per run), LOCK (/work/bench.lock if it exists: held while measuring; the build runs
# outside it).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=results/redis-fleet
secs=${SECS:-5}
lock=${LOCK:-/work/bench.lock}
nice -n 15 cargo build --release -p tollgate-lab --bin fleet-processes
exe=target/release/fleet-processes
locked() { if [ -e "$lock" ]; then flock "$lock" "$@"; else "$@"; fi; }
{
  echo "command: results/redis-fleet/run.sh  (SECS=$secs)"
  echo "  = flock $lock $exe --secs $secs --json $out/fleet.json"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (+ uncommitted changes under crates/)')"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo | sed 's/^model name\s*: /cpu: /'
  echo "redis: $(redis-server --version)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
locked "$exe" --secs "$secs" --json "$out/fleet.json" 2>&1 | tee "$out/fleet.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
