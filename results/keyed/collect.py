#!/usr/bin/env python3
"""Turns criterion's estimates for the `keyed` bench into a Markdown table and a JSON file.

Usage (from the repo root, after the bench ran):
    python3 results/keyed/collect.py > results/keyed/table.md
Reads target/criterion/keyed_*/{tollgate,governor}/{1,2}/new/estimates.json; writes
results/keyed/criterion.json (raw medians and intervals). Each criterion iteration is one decision per
thread, so ns/decision = median / threads and decisions/s = threads / median.
"""
import json
import os
import sys

ROOT = os.path.join("target", "criterion")
SCENARIOS = ["hot_key", "1k_keys", "1m_uniform", "1m_zipf"]
raw = {}
rows = []
for scenario in SCENARIOS:
    for threads in (1, 2):
        cell = {}
        for name in ("tollgate", "governor"):
            path = os.path.join(ROOT, f"keyed_{scenario}", name, str(threads), "new", "estimates.json")
            try:
                with open(path) as f:
                    est = json.load(f)
            except FileNotFoundError:
                continue
            median = est["median"]["point_estimate"]
            low = est["median"]["confidence_interval"]["lower_bound"]
            high = est["median"]["confidence_interval"]["upper_bound"]
            raw[f"{scenario}/{name}/{threads}"] = {"median_ns_per_iter": median, "ci95": [low, high]}
            cell[name] = median
        if len(cell) == 2:
            rows.append((scenario, threads, cell["tollgate"], cell["governor"]))

with open(os.path.join("results", "keyed", "criterion.json"), "w") as f:
    json.dump(raw, f, indent=1)

out = sys.stdout
out.write("| scenario | threads | tollgate ns/decision | governor ns/decision | tollgate M decisions/s | governor M decisions/s | speed-up |\n")
out.write("|---|---|---|---|---|---|---|\n")
for scenario, threads, ours, theirs in rows:
    out.write(
        f"| {scenario} | {threads} | {ours / threads:.1f} | {theirs / threads:.1f} | "
        f"{threads * 1e3 / ours:.2f} | {threads * 1e3 / theirs:.2f} | {theirs / ours:.2f}× |\n"
    )
