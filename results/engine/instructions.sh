#!/usr/bin/env bash
# Instruction counts per policy decision (issue 24 item 3), baseline vs this checkout, for a machine
# whose timings are noisy or that has no hardware counters (`perf stat -e instructions:u` is not
# supported in a VM without a PMU): valgrind's callgrind counts the instructions executed inside
# the Pingora policy decision (`PingoraLimiter::decide`, with everything it calls), over every call
# of the `decide` bench's policy cells (1, 10 000 and 1 000 000 keys, 3 repetitions, warm-ups included).
#
#   BASE=/path/to/baseline/worktree results/engine/instructions.sh   # both binaries built already
#   ITERS=20000 BASE=... results/engine/instructions.sh
#   BASE= results/engine/instructions.sh   # this checkout only (compare with a recorded base figure)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BASE=${BASE?set BASE to a worktree of the baseline commit, or to nothing for this checkout only}
ITERS=${ITERS:-20000}
bin() { if [ -e "$1/crates/lab/src/bin/pingora-bench.rs" ]; then echo "$1/target/release/pingora-bench"; else echo "$1/target/release/examples/bench"; fi; }
count() {
  local exe=$1 out
  # `PingoraLimiter::decide` at the baseline, `PingoraLimiter<C>::decide` under the new edge;
  # with a second argument, also the writing of the `RateLimit` header value after it (the
  # `policy-headers` mode: the baseline wrote it inside `decide`).
  local symbol='tollgate_pingora::PingoraLimiter*::decide'
  local extra=() modes=()
  if [ -n "${2:-}" ]; then
    extra=(--toggle-collect='tollgate_http::headers::RateLimitValue::to_value')
    modes=(--modes policy-headers)
  elif [ "$(basename "$exe")" = pingora-bench ]; then
    # Only the `policy` cells (the lab bench also has `policy-headers`; the old example has no
    # `--modes`, and its other modes never call `decide`).
    modes=(--modes policy)
  fi
  out=$(mktemp)
  valgrind --tool=callgrind --toggle-collect="$symbol" "${extra[@]}" --callgrind-out-file="$out" \
    "$exe" decide --iters "$ITERS" "${modes[@]}" >/dev/null 2>&1
  local total calls
  total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
  # Decisions made: per keys cell and repetition, a warm-up of min(keys, ITERS) and ITERS timed.
  calls=0
  for keys in 1 10000 1000000; do
    calls=$((calls + 3 * ((keys < ITERS ? keys : ITERS) + ITERS)))
  done
  rm -f "$out"
  echo "$symbol $total instructions / $calls decisions = $((total / calls)) per decision"
}
if [ -n "$BASE" ]; then
  echo "base ($(git -C "$BASE" rev-parse --short HEAD)): $(count "$(bin "$BASE")")"
fi
echo "new ($(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty')): $(count "$(bin "$ROOT")")"
echo "new, decide + RateLimit header value written: $(count "$(bin "$ROOT")" headers)"
