#!/usr/bin/env bash
# Runs the reserve + settle benchmark and records it here (from the repo root or anywhere). Run it
# on a quiet machine: wall-clock figures are meaningless while other builds share the cores.
#   results/settle/run.sh [criterion args...]
# Writes: criterion.txt (criterion's output), machine.txt (command, CPU, cores, load, date, commit).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/settle
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--warm-up-time 1 --measurement-time 3)
cmd="cargo bench -p tollgate-benches --bench settle -- ${args[*]}"
{
  echo "command: $cmd"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)"
  echo "nproc: $(nproc)"
  echo "cpu: $(lscpu | grep 'Model name' | sed 's/.*: *//')"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
cargo bench -p tollgate-benches --bench settle -- "${args[@]}" > "$out/criterion.txt" 2>&1
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
grep -E "^settle/|time:|denied" "$out/criterion.txt"
