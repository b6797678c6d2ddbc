#!/usr/bin/env bash
# Explain's cost, off and on: the `explain` criterion bench (benches/benches/explain.rs), in one
# binary on one 3-rule policy. Records the machine, the interleaved A/B lines and criterion's rows.
# Usage: results/explain/run.sh [criterion args...]   (from anywhere inside the repository)
# Default criterion args: --warm-up-time 1 --measurement-time 3. Run it on a quiet machine
# (CPU=<n> pins it to one core with taskset; default: not pinned).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=results/explain
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--warm-up-time 1 --measurement-time 3)
# Build first, so the build's load is over before the machine is described.
cargo bench -p tollgate-benches --bench explain --no-run
pin=()
[ -n "${CPU:-}" ] && pin=(taskset -c "$CPU")
{
  echo "command: ${pin[*]} cargo bench -p tollgate-benches --bench explain -- ${args[*]}"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo | sed 's/^model name\s*: /cpu: /'
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
"${pin[@]}" cargo bench -p tollgate-benches --bench explain -- "${args[@]}" 2>&1 | tee "$out/criterion.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
grep 'interleaved' "$out/criterion.txt" || true
