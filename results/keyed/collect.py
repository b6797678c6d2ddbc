#!/usr/bin/env python3
"""Turns criterion's estimates for the `keyed` bench into JSON and a Markdown table.

    python3 results/keyed/collect.py --append   # after a bench run: add its medians to runs.jsonl
    python3 results/keyed/collect.py            # print the table over every run in runs.jsonl

Reads target/criterion/keyed_*/{tollgate,governor,tollgate_check_keys}/{1,2}/new/estimates.json and
keyed_floor/dependent_load_23mb. Each criterion iteration is one decision per thread, so
ns/decision = median / threads and decisions/s = threads / median.
The machine is shared (2 cores, other jobs running), so the table gives, per cell, the best (lowest)
median over the runs — the least disturbed measurement — and the spread across runs beside it.
"""
import json
import os
import sys

ROOT = os.path.join("target", "criterion")
RUNS = os.path.join("results", "keyed", "runs.jsonl")
SCENARIOS = ["hot_key", "1k_keys", "1m_uniform", "1m_zipf"]
NAMES = ("tollgate", "governor", "tollgate_check_keys")
FLOOR = os.path.join(ROOT, "keyed_floor", "dependent_load_23mb", "new", "estimates.json")


def read_run():
    run = {}
    for scenario in SCENARIOS:
        for threads in (1, 2):
            for name in NAMES:
                path = os.path.join(ROOT, f"keyed_{scenario}", name, str(threads), "new", "estimates.json")
                if os.path.exists(path):
                    with open(path) as f:
                        run[f"{scenario}/{name}/{threads}"] = json.load(f)["median"]["point_estimate"]
    if os.path.exists(FLOOR):
        with open(FLOOR) as f:
            run["floor"] = json.load(f)["median"]["point_estimate"]
    return run


if "--append" in sys.argv:
    run = read_run()
    with open("/proc/loadavg") as f:
        run["loadavg"] = f.read().split()[0]
    with open(RUNS, "a") as f:
        f.write(json.dumps(run) + "\n")
    sys.exit(0)

with open(RUNS) as f:
    runs = [json.loads(line) for line in f if line.strip()]
out = sys.stdout
out.write(f"Best of {len(runs)} runs (lowest median per cell; range over runs in brackets).\n\n")
floors = [r["floor"] for r in runs if "floor" in r]
if floors:
    out.write(f"Memory floor (one dependent load over a 23 MB buffer): {min(floors):.1f} ns.\n\n")
out.write("| scenario | threads | tollgate ns/decision | governor ns/decision | tollgate M decisions/s | governor M decisions/s | speed-up | tollgate check_keys ns/decision | check_keys M decisions/s |\n")
out.write("|---|---|---|---|---|---|---|---|---|\n")
for scenario in SCENARIOS:
    for threads in (1, 2):
        cells = {}
        for name in NAMES:
            values = [r[f"{scenario}/{name}/{threads}"] / threads for r in runs if f"{scenario}/{name}/{threads}" in r]
            if values:
                cells[name] = (min(values), max(values))
        if "tollgate" not in cells or "governor" not in cells:
            continue
        (ours, ours_hi), (theirs, theirs_hi) = cells["tollgate"], cells["governor"]
        stream = "– | –"
        if "tollgate_check_keys" in cells:
            best, hi = cells["tollgate_check_keys"]
            stream = f"{best:.1f} [{best:.0f}–{hi:.0f}] | {1e3 / best:.2f}"
        out.write(
            f"| {scenario} | {threads} | {ours:.1f} [{ours:.0f}–{ours_hi:.0f}] | {theirs:.1f} [{theirs:.0f}–{theirs_hi:.0f}] | "
            f"{1e3 / ours:.2f} | {1e3 / theirs:.2f} | {theirs / ours:.2f}× | {stream} |\n"
        )
