#!/usr/bin/env python3
"""Reads criterion's output (stdin) of the `inflight` bench; prints a Markdown table of the median
time per request (criterion's time / threads) and the ratio of each in-flight case to its rate case."""
import re
import sys

UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
CASES = [
    ("inflight/keyed", "rate", "in_flight"),
    ("inflight/keyed", "rate", "in_flight_scoped"),
    ("inflight/single", "rate", "in_flight"),
    ("inflight/policy", "check_rate", "admit_rate_and_in_flight"),
]

medians = {}
name = None
for line in sys.stdin:
    head = re.match(r"^(inflight/\S+)", line)
    if head:
        name = head.group(1)
    found = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
    if found and name:
        value, unit = float(found.group(1)), found.group(2)
        medians[name] = value * UNITS[unit]
        name = None

print("| group | in-flight case | threads | rate case (ns/request) | in-flight case (ns/request) | ratio |")
print("|---|---|---|---|---|---|")
for group, rate, inflight in CASES:
    for threads in (1, 2):
        r = medians.get(f"{group}/{rate}/{threads}")
        f = medians.get(f"{group}/{inflight}/{threads}")
        if r is None or f is None:
            continue
        print(f"| {group} | {inflight} | {threads} | {r / threads:.1f} | {f / threads:.1f} | {f / r:.2f} |")
