#!/usr/bin/env bash
# Criterion A/B of the decision paths before (1510e21) and after this session's refactors
# (issue 12: one CAS loop, one GCRA Timeline, the sharded split, diagnostics feature), interleaved
# base/head/base/head in one session. Build each tree with
#   CARGO_TARGET_DIR=<dir> cargo bench -p tollgate-benches --bench core --bench striped --bench keyed --no-run
# and pass the two deps/ directories.
set -euo pipefail
B=$1; H=$2
args=(--bench --warm-up-time 1 --measurement-time 3 --noplot)
run() { # label dir
  for bench in core striped keyed; do
    exe=$(ls "$2"/$bench-* | grep -v '\.d$' | head -1)
    case $bench in
      core) filter='^core/(allow|deny)/(gcra|governor|fixed_window)$' ;;
      striped) filter='^striped/contended/(gcra|striped)/(1|2)$' ;;
      keyed) filter='^keyed/(hot_key|1k_keys)/tollgate/1$' ;;
    esac
    "$exe" "${args[@]}" "$filter" 2>/dev/null | grep -E '^[a-z].*|time:' | sed "s/^/$1 /"
  done
}
for round in $(seq "${ROUNDS:-2}"); do run base "$B"; run head "$H"; done
