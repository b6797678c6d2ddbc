#!/usr/bin/env python3
"""Medians of the A/B micro file: per (mode, keys) and side, ns per decision over the loop's own
`none` row of the same side and round, and new/base."""
import re, statistics, sys
from collections import defaultdict

rows = defaultdict(list)  # (side, round, rep, keys) -> {mode: ns}
cells = defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.search(r"side=(\w+) round=(\d+) mode=([\w-]+) keys=(\d+) rep=(\d+) ns_per_op=([\d.]+)", line)
    if m:
        side, rnd, mode, keys, rep, ns = m.groups()
        cells[(side, rnd, rep, int(keys))][mode] = float(ns)
over = defaultdict(list)  # (mode, keys, side) -> [ns over none]
for (side, _, _, keys), modes in cells.items():
    for mode, ns in modes.items():
        if mode != "none" and "none" in modes:
            over[(mode, keys, side)].append(ns - modes["none"])
print("| mode | keys | n | base ns (median over loop) | new ns | new / base |")
print("|---|---:|---:|---:|---:|---:|")
# `policy-headers` (new only) also writes both field values as header values after the decision,
# as the baseline's `policy` did inside it: it is compared with the baseline's `policy`.
for mode in ["keyed", "policy", "policy-headers", "pingora-limits"]:
    base_mode = "policy" if mode == "policy-headers" else mode
    for keys in [1, 10000, 1000000]:
        b, n = over.get((base_mode, keys, "base")), over.get((mode, keys, "new"))
        if not b or not n:
            continue
        mb, mn = statistics.median(b), statistics.median(n)
        print(f"| {mode} | {keys:,} | {len(n)} | {mb:.0f} | {mn:.0f} | {mn / mb:.2f} |")
