#!/usr/bin/env bash
# Runs every loom model in loom-tests/ (optimised, bounded preemptions).
#
#   LOOM_MAX_PREEMPTIONS  default 2 (3 is feasible for the core models: LOOM_MAX_PREEMPTIONS=3 loom-tests/run.sh --test core)
#   extra arguments are passed to `cargo test` (e.g. `--test core`)
#
# The cfg flag is tollgate_loom, not loom, so tokio and other dependencies keep their normal code.
# A separate target dir keeps the cfg flip from invalidating the ordinary build.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg tollgate_loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"
exec cargo test --profile loom -p tollgate-loom-tests "$@"
