#!/usr/bin/env bash
# Decisions/s and latency, per-request GCRA vs the lease mode at 1, 32 and 128 tasks, on a 3+3 Redis
# Cluster beside a single redis-server (both started by the benchmark on free loopback ports).
# Usage: results/redis-cluster/run.sh   (from anywhere inside the repository)
# Env: OUT (results/redis-cluster: where the raw files and summary go), REPS (3), SECS (5 measured per row), WARM (1 unmeasured per row), LOCK (/work/bench.lock if it
# exists: each repetition holds it while measuring; the build runs outside it).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=${OUT:-results/redis-cluster}; mkdir -p "$out"
reps=${REPS:-3}; secs=${SECS:-5}; warm=${WARM:-1}
lock=${LOCK:-/work/bench.lock}
nice -n 15 cargo build --release -p tollgate-lab --bin cluster-bench
exe=target/release/cluster-bench
locked() { if [ -e "$lock" ]; then flock "$lock" "$@"; else "$@"; fi; }
{
  echo "command: results/redis-cluster/run.sh  (REPS=$reps SECS=$secs WARM=$warm)"
  echo "  = for i in 1..$reps: flock $lock $exe --secs $secs --warm $warm --rep \$i --json $out/rep\$i.json"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (+ uncommitted changes under crates/)')"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo | sed 's/^model name\s*: /cpu: /'
  echo "redis: $(redis-server --version)"
  echo "rustc: $(rustc --version)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"
for i in $(seq "$reps"); do
  echo "load before rep $i: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
  locked "$exe" --secs "$secs" --warm "$warm" --rep "$i" --json "$out/rep$i.json" 2>&1 | tee "$out/rep$i.txt"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
files=(); for i in $(seq "$reps"); do files+=("$out/rep$i.json"); done
"$exe" --summarize "${files[@]}" | tee "$out/summary.md"
