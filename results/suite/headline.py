#!/usr/bin/env python3
"""Prints the results guide's headline (guides/results.md): every scenario row (quota mode × keys × threads) of the
GCRA limiters (gcra and striped against governor, keyed_gcra against governor's keyed limiter), with
the ratio to governor at each clock, from the committed suite JSONs.

    python3 results/suite/headline.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = [("TSC clock", "suite.json"), ("coarse clock", "coarse-clock/suite.json"),
        ("fixed instant (no clock read)", "fixed-clock/suite.json")]
runs = [(label, json.load(open(os.path.join(HERE, path)))["records"]) for label, path in RUNS]


def find(records, imp, quota, keys, threads):
    for r in records:
        if (r["impl"], r["quota_mode"], r["key_dist"], r["threads"], r["loop_mode"]) == (imp, quota, keys, threads, "closed"):
            return r
    return None


rows = []
for imp, peer, dists in [("gcra", "governor", ["single"]), ("striped", "governor", ["single"]),
                         ("keyed_gcra", "governor_keyed",
                          ["single", "uniform:10000", "zipf:10000:1", "uniform:1000000", "zipf:1000000:1"])]:
    for quota in ("allow", "deny"):
        for keys in dists:
            for threads in (1, 2):
                rows.append((imp, peer, quota, keys, threads))

print("| Tollgate row | quota | keys | threads | " + " | ".join(label for label, _ in runs) + " |")
print("|---|---|---|---:|" + "---|" * len(runs))
for imp, peer, quota, keys, threads in rows:
    cells = []
    for _, records in runs:
        ours, theirs = find(records, imp, quota, keys, threads), find(records, peer, quota, keys, threads)
        floor = find(records, "cas_floor", quota, "single", threads)
        if not ours or not theirs:
            cells.append("–")
            continue
        ratio = ours["ns_per_decision"] / theirs["ns_per_decision"]
        cell = f"{ours['ns_per_decision']:.1f} vs {theirs['ns_per_decision']:.1f} = **{ratio:.2f}**"
        if ratio > 0.9 and floor and not imp.startswith("keyed_"):
            cell += f" (floor {floor['ns_per_decision'] / theirs['ns_per_decision']:.2f})"
        cells.append(cell)
    print(f"| {imp} vs {peer} | {quota} | {keys} | {threads} | " + " | ".join(cells) + " |")
