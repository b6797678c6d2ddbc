#!/usr/bin/env bash
# Runs the in-flight benchmark and records it here (from the repo root or anywhere). Run it on a
# quiet machine: wall-clock figures are meaningless while other builds share the cores.
#   results/concurrency/run.sh
# Writes: criterion.txt (criterion's output), machine.txt (command, CPU, cores, load, date, commit),
#         table.md (median ns per request and the in-flight / rate ratio per group and thread count).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/concurrency
cmd='cargo bench -p tollgate-benches --bench inflight -- --warm-up-time 1 --measurement-time 3'
{
  echo "command: $cmd"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)"
  echo "nproc: $(nproc)"
  echo "cpu: $(lscpu | grep 'Model name' | sed 's/.*: *//')"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
$cmd > "$out/criterion.txt" 2>&1
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
python3 "$out/collect.py" < "$out/criterion.txt" > "$out/table.md"
cat "$out/table.md"
