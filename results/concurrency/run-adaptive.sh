#!/usr/bin/env bash
# Regenerates results/concurrency/adaptive.csv and the table in adaptive.md. Simulated time and a
# fixed seed: the figures are the same on any machine, busy or not.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo run --release -p tollgate-adaptive --example adaptive_sim -- results/concurrency/adaptive.csv
