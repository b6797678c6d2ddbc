#!/usr/bin/env bash
# Instructions per policy request (callgrind, one thread, a fixed instant) for two rules, a keyed
# `per_client` then a `global`: `refund` mode, where the global rule denies every request and the
# keyed admission is given back; `admit` mode, where both admit (the cost of keeping the refund's
# receipt). benches/examples/policy_refund_instructions.rs; figures in results/engine/refund.md.
#   results/engine/refund.sh                       # this checkout
#   OLD=/path/to/policy_refund_instructions results/engine/refund.sh   # and a binary built elsewhere
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p tollgate-benches --example policy_refund_instructions
new=${CARGO_TARGET_DIR:-target}/release/examples/policy_refund_instructions
n=${N:-100000}
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty'), $(date -u +%FT%TZ)," \
  "nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for bin in ${OLD:+"$OLD"} "$new"; do
  for mode in refund admit; do
    for keys in ${KEYS:-1 10000 1000000}; do
      ir=$(valgrind --tool=callgrind --toggle-collect="*stage_decide*" --callgrind-out-file=/dev/null \
        "$bin" "$n" "$keys" "$mode" 2>&1 >/dev/null | awk '/Collected :/ {print $NF}')
      echo "$bin $mode keys=$keys: $(echo "scale=1; $ir / $n" | bc) instructions per request"
    done
  done
done
