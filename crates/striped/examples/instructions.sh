#!/usr/bin/env bash
# Instructions per decision (user space) of plain GCRA and the striped limiter, allow and deny, at 1
# and 2 threads, on the three clocks. With `perf stat -e instructions:u` where the CPU exposes a
# counter: (count at 2N calls − count at N calls) / (N × threads), so set-up and thread start cancel.
# Else (a VM without a PMU: `<not supported>`) with valgrind's callgrind, counting the measured loop
# alone (`--toggle-collect`); valgrind runs threads one at a time, so the 2-thread rows see little
# contention. Run from anywhere: crates/striped/examples/instructions.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release -q -p tollgate-striped --example decision_instructions
bin=${CARGO_TARGET_DIR:-target}/release/examples/decision_instructions
n=${N:-1000000}
if perf stat -x, -e instructions:u true 2>&1 | grep -q '^[0-9]'; then
  count() { perf stat -x, -e instructions:u "$bin" "$@" 2>&1 >/dev/null | awk -F, '/instructions/ {print $1}'; }
  per() { # calls threads args...: (count at 2N − count at N) / (N × threads)
    local a b; a=$(count "${@:3}" "$1"); b=$(count "${@:3}" $((2 * $1)))
    echo "scale=2; ($b - $a) / ($1 * $2)" | bc
  }
else
  n=${N:-100000}
  per() { # calls threads args...: the measured loop alone, Ir / (N × threads)
    local ir
    ir=$(valgrind --tool=callgrind --toggle-collect='*decide_loop*' --callgrind-out-file=/dev/null \
      "$bin" "${@:3}" "$1" 2>&1 >/dev/null | awk '/Collected :/ {print $NF}')
    echo "scale=2; $ir / ($1 * $2)" | bc
  }
fi
printf '| mode | clock | threads | gcra | striped | ratio | striped, stripe path | ratio |\n|---|---|---:|---:|---:|---:|---:|---:|\n'
for mode in allow deny; do
  for clock in tsc coarse fixed; do
    for threads in 1 2; do
      row=()
      for which in gcra striped striped_lease; do
        row+=("$(per "$n" "$threads" "$which" "$mode" "$clock" "$threads")")
      done
      printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$mode" "$clock" "$threads" "${row[0]}" \
        "${row[1]}" "$(echo "scale=2; ${row[1]} / ${row[0]}" | bc)" \
        "${row[2]}" "$(echo "scale=2; ${row[2]} / ${row[0]}" | bc)"
    done
  done
done
