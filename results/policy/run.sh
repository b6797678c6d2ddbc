#!/usr/bin/env bash
# Reproduces results/policy: the policy engine's criterion benchmarks, with the machine noted.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/policy
{
  echo "commit: $(git rev-parse --short HEAD)"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "nproc: $(nproc)"
  grep -m1 "model name" /proc/cpuinfo
  echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
cargo bench -p tollgate-benches --bench policy -- --warm-up-time 1 --measurement-time 3 2>&1 | tee "$out/bench.txt"
