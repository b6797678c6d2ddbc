#!/usr/bin/env bash
# The engine redesign's in-process A/B (issue 24 item 3): the Pingora bench's `decide` (the
# policy's per-request work with both RateLimit header values, and keyed GCRA beside it) built from
# a baseline commit and from this checkout, run in interleaved rounds on one machine.
#
#   BASE=/path/to/baseline/worktree results/engine/ab.sh      # the baseline built there already
#   ROUNDS=5 ITERS=1000000 OUT=results/engine/raw results/engine/ab.sh
#
# Each round runs the baseline binary then this checkout's (each `decide` prints 3 repetitions per
# (mode, keys) cell); summarize.py turns the files into medians over the loop's own `none` row.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BASE=${BASE:?set BASE to a worktree of the baseline commit}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-1000000}
OUT=${OUT:-$HERE/raw}
mkdir -p "$OUT"
rm -f "$OUT/micro-ab.txt"
# The bench is tollgate-lab's `pingora-bench` binary; commits before the lab crate have it as
# tollgate-pingora's `bench` example.
bin() { if [ -e "$1/crates/lab/src/bin/pingora-bench.rs" ]; then echo "$1/target/release/pingora-bench"; else echo "$1/target/release/examples/bench"; fi; }
build() {
  if [ -e "$1/crates/lab/src/bin/pingora-bench.rs" ]; then
    (cd "$1" && cargo build --release -p tollgate-lab --bin pingora-bench --locked >/dev/null)
  else
    (cd "$1" && cargo build --release -p tollgate-pingora --example bench --locked >/dev/null)
  fi
}
build "$BASE"
build "$ROOT"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "machine: nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "base: $(git -C "$BASE" rev-parse --short HEAD)"
  echo "new: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty')"
  echo "command: bench decide --iters $ITERS, $ROUNDS interleaved rounds"
} >"$OUT/machine.txt"
for round in $(seq 1 "$ROUNDS"); do
  for side in base new; do
    dir=$BASE; [ "$side" = new ] && dir=$ROOT
    "$(bin "$dir")" decide --iters "$ITERS" | sed "s/^MICRO /MICRO side=$side round=$round /" >>"$OUT/micro-ab.txt"
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/machine.txt"
python3 "$HERE/summarize.py" "$OUT/micro-ab.txt"
