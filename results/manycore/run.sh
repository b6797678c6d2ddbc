#!/usr/bin/env bash
# Issue 30 item 4: the thread sweep 1, 2, 4, 8, 16 on a many-core machine; writes into $OUT.
# The binaries are built on the 2-core VM and run from the folder holding this script:
#   cargo build --release -p tollgate-loadgen && cargo bench -p tollgate-benches --no-run
#   mkdir -p .dev && cp target/release/tollgate-bench results/manycore/run.sh .dev/
#   cp target/release/deps/keyed-<hash> .dev/keyed && cp target/release/deps/policy-<hash> .dev/policy
#   strip .dev/keyed .dev/policy .dev/tollgate-bench && OUT=<folder> .dev/run.sh
# Then results/manycore/summary.py builds the README's tables from run*/.
set -uo pipefail
cd "$(dirname "$0")"
export CRITERION_HOME=/tmp/criterion
threads=1,2,4,8,16
busy() { echo "$(date -u +%H:%M:%SZ) load $(cut -d' ' -f1-3 /proc/loadavg), other busy processes: $(ps -eo pcpu=,comm= | awk '$1>5' | wc -l)"; }
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: *//')"
  lscpu | grep -E 'Socket|Core|Thread|NUMA|L1d|L2|L3|MHz|Hypervisor|Virtualization'
  echo "kernel: $(uname -r)"
  grep -E 'MemTotal' /proc/meminfo
  echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
  echo "before loadgen: $(busy)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
./tollgate-bench run --impls gcra,striped,keyed_gcra,governor,governor_keyed --keys single,uniform:1000000 \
  --threads $threads --loop closed --duration 300ms --warmup 100ms --repeat 3 --no-plots --out "$OUT/suite" \
  > "$OUT/loadgen.log" 2>&1
echo "loadgen rc $?"; echo "before keyed: $(busy)" >> "$OUT/machine.txt"
TOLLGATE_BENCH_THREADS=$threads ./keyed --bench 'keyed/hot_' --warm-up-time 0.3 --measurement-time 1 \
  --sample-size 20 --noplot > "$OUT/keyed.txt" 2>&1
echo "keyed rc $?"; echo "before policy: $(busy)" >> "$OUT/machine.txt"
TOLLGATE_BENCH_THREADS=$threads ./policy --bench 'policy/threads' --warm-up-time 0.3 --measurement-time 1 \
  --sample-size 20 --noplot > "$OUT/policy.txt" 2>&1
echo "policy rc $?"; echo "after: $(busy)" >> "$OUT/machine.txt"
grep -E "^(keyed|policy)/|time:|promoted keys" "$OUT/keyed.txt" "$OUT/policy.txt" | grep -v "%" | head -80
