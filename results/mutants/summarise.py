#!/usr/bin/env python3
"""Per-file caught / missed / unviable / timeout counts from cargo-mutants' outcomes.json.

    results/mutants/summarise.py <dir holding mutants.out> [...]

Prints a Markdown table (one row per source file, then a total row per run).
"""
import collections
import json
import pathlib
import sys

KINDS = {"CaughtMutant": "caught", "MissedMutant": "missed", "Unviable": "unviable", "Timeout": "timeout"}

for arg in sys.argv[1:]:
    path = pathlib.Path(arg)
    if path.is_dir():
        path = path / "mutants.out" / "outcomes.json" if (path / "mutants.out").is_dir() else path / "outcomes.json"
    outcomes = json.loads(path.read_text())["outcomes"]
    per_file = collections.defaultdict(collections.Counter)
    for outcome in outcomes:
        scenario = outcome["scenario"]
        if scenario == "Baseline":
            continue
        mutant = scenario["Mutant"]
        per_file[mutant["file"]][KINDS.get(outcome["summary"], outcome["summary"])] += 1
    print(f"\n{arg}\n")
    print("| file | mutants | caught | missed | unviable | timeout |")
    print("|---|---|---|---|---|---|")
    total = collections.Counter()
    for file in sorted(per_file):
        c = per_file[file]
        total.update(c)
        print(f"| `{file}` | {sum(c.values())} | {c['caught']} | {c['missed']} | {c['unviable']} | {c['timeout']} |")
    print(f"| **total** | {sum(total.values())} | {total['caught']} | {total['missed']} | {total['unviable']} | {total['timeout']} |")
