#!/usr/bin/env bash
# Instructions per denial at a fixed instant, one thread (callgrind, so the machine's load does not
# matter), then each loop's wall-clock time on one pinned CPU: plain GCRA, the striped limiter on its
# alone path, on its stripes (`always_lease`: the cached denial), and governor's direct limiter.
# benches/examples/striped_deny_instructions.rs; figures in results/striped/README.md.
#   results/striped/deny_floor.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p tollgate-benches --example striped_deny_instructions
bin=${CARGO_TARGET_DIR:-target}/release/examples/striped_deny_instructions
n=${N:-200000}
echo "commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), nproc $(nproc)," \
  "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for stage in gcra striped_alone striped_leasing governor; do
  ir=$(valgrind --tool=callgrind --toggle-collect="*stage_${stage}*" --callgrind-out-file=/dev/null \
    "$bin" "$n" "$stage" 2>&1 >/dev/null | awk '/Collected :/ {print $NF}')
  echo "$stage: $(echo "scale=1; $ir / $n" | bc) instructions per denial"
done
cpu=$(( $(nproc) - 1 ))
for run in 1 2 3; do
  echo "time run $run (CPU $cpu): $(taskset -c "$cpu" "$bin" 100000000 time | tr '\n' ' ')"
done
