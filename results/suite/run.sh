#!/usr/bin/env bash
# Re-runs the load-generator suite at the three clocks and rebuilds the ratio table (from anywhere).
#   results/suite/run.sh
# Writes: suite.json, report.md, *.svg (TSC clock); coarse-clock/ (CoarseClock, 1 ms); fixed-clock/
# (a caller-supplied instant: the limiters' own cost); ratios.md (every Tollgate row ÷ governor, per
# clock); machine.txt (command, CPU, cores, load and concurrent compilers, date, commit).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/suite
keys=single,uniform:10000,zipf:10000:1.0,uniform:1000000,zipf:1000000:1.0
common=(--keys "$keys" --duration 400ms --warmup 100ms --repeat 3)
cargo build --release -p tollgate-loadgen
busy() { echo "load $(cut -d' ' -f1-3 /proc/loadavg), rustc processes running: $(pgrep -c rustc || true)"; }
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet -- crates || echo ' (crates/ dirty)')"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: *//'), L3 $(lscpu | grep 'L3' | sed 's/.*: *//')"
  echo "before TSC suite: $(busy)"
} > "$out/machine.txt"
cargo run --release -q -p tollgate-loadgen -- "${common[@]}" --out "$out"
echo "before coarse suite: $(busy)" >> "$out/machine.txt"
cargo run --release -q -p tollgate-loadgen -- "${common[@]}" --clock coarse --loop closed --out "$out/coarse-clock"
echo "before fixed suite: $(busy)" >> "$out/machine.txt"
cargo run --release -q -p tollgate-loadgen -- "${common[@]}" --clock fixed --loop closed --out "$out/fixed-clock"
echo "before anomaly runs: $(busy)" >> "$out/machine.txt"
# The single-limiter rows again, 7 interleaved repetitions each, for the coarse-clock anomalies.
for clock in coarse fixed; do
  cargo run --release -q -p tollgate-loadgen -- --impls gcra,governor,cas_floor,clock_only --keys single \
    --threads 1,2 --loop closed --repeat 7 --duration 200ms --warmup 50ms --clock "$clock" --no-plots \
    --out "$out/anomalies/$clock"
done
echo "after: $(busy), $(date -u +%H:%M:%SZ)" >> "$out/machine.txt"
cargo run --release -q -p tollgate-loadgen -- ratios \
  --json "$out/suite.json,$out/coarse-clock/suite.json,$out/fixed-clock/suite.json" --out "$out/ratios.md"
