#!/usr/bin/env bash
# Issue 30 item 1: the striped limiter's denial against plain GCRA's, as the suite measures them
# (`check().is_allowed()` in the load generator's closed loop, one key, 1 per hour), on the three
# clocks, with the two limiters' repetitions interleaved in one run so that each striped
# repetition has a GCRA repetition next to it in time: the ratio is taken per repetition, then its
# median (this VM's speed moves between runs by more than the difference measured).
#   results/striped/deny_ratio.sh            # BIN=path/to/tollgate-bench skips the build
# Writes results/striped/deny-ratio/<clock>/suite.json and prints the table.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p tollgate-loadgen
  BIN=${CARGO_TARGET_DIR:-target}/release/tollgate-bench
fi
out=results/striped/deny-ratio
echo "commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), nproc $(nproc)," \
  "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
for clock in tsc coarse fixed; do
  "$BIN" --impls gcra,striped --keys single --threads 1,2 --quota deny --loop closed --repeat "${REPS:-9}" \
    --duration 200ms --warmup 50ms --clock "$clock" --no-plots --out "$out/$clock" >/dev/null 2>&1
done
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
print("| clock | threads | gcra ns | striped ns | striped / gcra, per repetition: median (range) |")
print("|---|---:|---:|---:|---:|")
for clock in ("tsc", "coarse", "fixed"):
    runs = {(r["impl"], r["threads"]): r["ns_per_decision_runs"]
            for r in json.load(open(f"{out}/{clock}/suite.json"))["records"]}
    for threads in (1, 2):
        g, s = runs[("gcra", threads)], runs[("striped", threads)]
        ratios = [b / a for a, b in zip(g, s)]
        print(f"| {clock} | {threads} | {statistics.median(g):.2f} | {statistics.median(s):.2f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
PY
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
