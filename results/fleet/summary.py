#!/usr/bin/env python3
"""results/fleet's summary: medians per row over the repetitions, and the ratios issue 26 asks for.

Usage: python3 results/fleet/summary.py OUT   (OUT: the run's raw folder, with ROW-sSTREAMS-rREP.json)

Prints markdown: one line per (row, streams) with the medians, the comparisons (ratio of the
medians, and the range of the same ratio taken within each repetition, whose rows ran minutes
apart at most), the CPU per call, and a check line. Exits 2 when any run had an OVER_LIMIT answer
or an error (every quota is far above the load, so the row did not measure what it says), or when
no run is found.
"""
import glob
import json
import os
import re
import statistics
import sys

ROWS = [
    "tollgate_embedded",
    "tollgate_per_request",
    "tollgate_lease",
    "tollgate_durable",
    "limitador_memory",
    "limitador_redis",
    "limitador_redis_cached",
]

# (A, B, what it says, issue 26's bar for A / B at 64 streams, or None).
COMPARISONS = [
    ("tollgate_per_request", "tollgate_embedded", "3-rule per request vs embedded", 0.5),
    ("tollgate_per_request", "limitador_redis", "per request vs limitador redis", 2.9),
    ("tollgate_lease", "limitador_redis_cached", "lease vs limitador redis_cached", 4.6),
    ("tollgate_embedded", "limitador_memory", "embedded vs limitador memory", None),
    ("tollgate_durable", "tollgate_per_request", "durable (WAIT 1 replica) vs per request", None),
]

# (tollgate row, limitador row): CPU per call compared, limitador / tollgate.
CPU_PAIRS = [
    ("tollgate_embedded", "limitador_memory"),
    ("tollgate_per_request", "limitador_redis"),
    ("tollgate_lease", "limitador_redis_cached"),
]


def load(out):
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "*-s*-r*.json"))):
        m = re.fullmatch(r"(.+)-s(\d+)-r(\d+)\.json", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            report = json.load(f)
        runs.setdefault((m.group(1), int(m.group(2))), {})[int(m.group(3))] = report
    return runs


def cpu(report, who):
    return (report.get(who) or {}).get("us_per_call", float("nan"))


def med(reports, f):
    return statistics.median(f(r) for r in reports)


def fmt(x, digits=1):
    return "—" if x != x else f"{x:.{digits}f}"


def order(key):
    row, streams = key
    return (ROWS.index(row) if row in ROWS else len(ROWS), row, streams)


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    runs = load(sys.argv[1])
    if not runs:
        print(f"no runs in {sys.argv[1]}", file=sys.stderr)
        return 2
    calls_per_s = lambda r: r["calls_per_s"]

    print("| row | streams | reps | calls/s (median) | p50 µs | p99 µs | p99.9 µs | max µs "
          "| server CPU µs/call | redis-server CPU µs/call | client CPU µs/call | over_limit | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(runs, key=order):
        row, streams = key
        rs = list(runs[key].values())
        print(f"| {row} | {streams} | {len(rs)} | {med(rs, calls_per_s):,.0f} "
              f"| {med(rs, lambda r: r['latency_us']['p50']):.0f} "
              f"| {med(rs, lambda r: r['latency_us']['p99']):.0f} "
              f"| {med(rs, lambda r: r['latency_us']['p999']):.0f} "
              f"| {med(rs, lambda r: r['latency_us']['max']):.0f} "
              f"| {fmt(med(rs, lambda r: cpu(r, 'server_cpu')))} "
              f"| {fmt(med(rs, lambda r: cpu(r, 'other_cpu')))} "
              f"| {fmt(med(rs, lambda r: cpu(r, 'client_cpu')))} "
              f"| {sum(r['over_limit'] for r in rs)} of {sum(r['calls'] for r in rs)} "
              f"| {sum(r['errors'] for r in rs)} |")

    all_streams = sorted({s for _, s in runs})
    print()
    print("| comparison (calls/s, A / B) | streams | A median | B median | ratio of medians "
          "| per-repetition ratios | issue 26 bar (64 streams) |")
    print("|---|---|---|---|---|---|---|")
    for a, b, what, bar in COMPARISONS:
        for streams in all_streams:
            ra, rb = runs.get((a, streams)), runs.get((b, streams))
            if not ra or not rb:
                continue
            ma, mb = med(ra.values(), calls_per_s), med(rb.values(), calls_per_s)
            per_rep = [ra[k]["calls_per_s"] / rb[k]["calls_per_s"]
                       for k in sorted(ra.keys() & rb.keys()) if rb[k]["calls_per_s"] > 0]
            spread = f"{min(per_rep):.2f}–{max(per_rep):.2f}" if per_rep else "—"
            ratio = ma / mb if mb > 0 else float("nan")
            goal = (f"≥ {bar}x: {'met' if ratio >= bar else 'NOT met'}"
                    if bar is not None and streams == 64 else "")
            print(f"| {what} | {streams} | {ma:,.0f} | {mb:,.0f} | {fmt(ratio, 2)}x | {spread} | {goal} |")

    print()
    print("| CPU per call (medians, µs) | streams | tollgate server | limitador server "
          "| limitador / tollgate | tollgate server + redis | limitador server + redis |")
    print("|---|---|---|---|---|---|---|")
    for t, l in CPU_PAIRS:
        for streams in all_streams:
            rt, rl = runs.get((t, streams)), runs.get((l, streams))
            if not rt or not rl:
                continue
            ct = med(rt.values(), lambda r: cpu(r, "server_cpu"))
            cl = med(rl.values(), lambda r: cpu(r, "server_cpu"))
            both = lambda r: cpu(r, "server_cpu") + (cpu(r, "other_cpu") if r.get("other_cpu") else 0.0)
            print(f"| {t} vs {l} | {streams} | {fmt(ct)} | {fmt(cl)} "
                  f"| {fmt(cl / ct if ct > 0 else float('nan'), 2)}x "
                  f"| {fmt(med(rt.values(), both))} | {fmt(med(rl.values(), both))} |")

    bad = [f"{row} s{streams} r{rep}: over_limit {r['over_limit']}, errors {r['errors']}"
           + (f" ({r['first_error']})" if r.get("first_error") else "")
           for (row, streams), reps in sorted(runs.items(), key=lambda kv: order(kv[0]))
           for rep, r in sorted(reps.items())
           if r["over_limit"] or r["errors"]]
    print()
    if bad:
        print("check FAILED (every quota is far above the load: each call should answer OK):")
        for line in bad:
            print(f"- {line}")
        return 2
    print(f"check: OVER_LIMIT 0 and errors 0 in all {sum(len(v) for v in runs.values())} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
