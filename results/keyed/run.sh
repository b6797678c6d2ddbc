#!/usr/bin/env bash
# Re-runs the keyed benchmarks and rewrites this folder's figures (from the repo root or anywhere).
#   results/keyed/run.sh
#   RUNS=3 results/keyed/run.sh   (several runs; the table keeps each cell's best median)
# Writes: criterion-N.txt (criterion's output per run), runs.jsonl (medians per run), table.md,
#         memory.txt (bytes per key at 1 M keys), machine.txt (command, CPU, cores, load, date, commit).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/keyed
cmd='cargo bench -p tollgate-benches --bench keyed -- --warm-up-time 1 --measurement-time 3'
{
  echo "command: $cmd"
  echo "memory command: cargo bench -p tollgate-benches --bench keyed_memory"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)"
  echo "nproc: $(nproc)"
  echo "cpu: $(lscpu | grep 'Model name' | sed 's/.*: *//')"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
rm -f "$out/runs.jsonl" "$out"/criterion-*.txt
for run in $(seq 1 "${RUNS:-1}"); do
  echo "load before run $run: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
  $cmd > "$out/criterion-$run.txt" 2>&1
  python3 "$out/collect.py" --append
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
python3 "$out/collect.py" > "$out/table.md"
cargo bench -p tollgate-benches --bench keyed_memory 2>/dev/null | tee "$out/memory.txt"
cat "$out/table.md"
