#!/usr/bin/env bash
# Instructions per keyed decision by stage (hash, lookup without a write, whole decision, the direct
# limiter's one-word decision), Tollgate's keyed table beside governor's keyed limiter, at a fixed
# instant on one thread: the figures of results/keyed/floor.md. Each stage runs alone under
# callgrind (`--toggle-collect` on its loop), so set-up, prefill and the other stages are not counted.
#   results/keyed/floor.sh            # builds benches/examples/keyed_instructions.rs in release
# BIN=path/to/keyed_instructions skips the build (e.g. a copy built outside the workspace).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p tollgate-benches --example keyed_instructions
  BIN=${CARGO_TARGET_DIR:-target}/release/examples/keyed_instructions
fi
n=${N:-200000}
stages=(tg_hash tg_peek tg_check tg_direct gov_hash gov_check gov_direct)
printf '| mode | keys |'; printf ' %s |' "${stages[@]}"; printf '\n|---|---:|'
printf -- '---:|%.0s' "${stages[@]}"; printf '\n'
for mode in allow deny; do
  for space in 1 10000 1000000; do
    printf '| %s | %s |' "$mode" "$space"
    for stage in "${stages[@]}"; do
      ir=$(valgrind --tool=callgrind --toggle-collect="*stage_${stage}*" --callgrind-out-file=/dev/null \
        "$BIN" "$mode" "$space" "$n" "$stage" 2>&1 >/dev/null | awk '/Collected :/ {print $NF}')
      printf ' %s |' "$(echo "scale=1; $ir / $n" | bc)"
    done
    printf '\n'
  done
done
