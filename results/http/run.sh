#!/usr/bin/env bash
# Runs the http layer bench briefly and records the raw criterion output with the machine and commit.
# Usage: results/http/run.sh [criterion args...]   (from anywhere inside the repository)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=results/http
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--warm-up-time 1 --measurement-time 3)
{
  echo "command: cargo bench -p tollgate-benches --bench http -- ${args[*]}"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)"
  echo "nproc: $(nproc)"
  lscpu | grep 'Model name' | sed 's/^ */cpu: /'
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
cargo bench -p tollgate-benches --bench http -- "${args[@]}" 2>&1 | tee "$out/criterion.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
