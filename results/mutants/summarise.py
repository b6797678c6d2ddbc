#!/usr/bin/env python3
"""Per-file caught / missed / unviable / timeout counts from cargo-mutants' outcomes.json.

    results/mutants/summarise.py DIR [DIR ...]          one table per run
    results/mutants/summarise.py --merge DIR DIR [...]  one table: later runs' outcomes replace
                                                        earlier ones for the same mutant (an
                                                        `--iterate` re-run on top of a full run)

DIR holds mutants.out/ (or is it). Prints Markdown.
"""
import collections
import json
import pathlib
import sys

KINDS = {"CaughtMutant": "caught", "MissedMutant": "missed", "Unviable": "unviable", "Timeout": "timeout"}


def outcomes(arg):
    path = pathlib.Path(arg)
    if (path / "mutants.out").is_dir():
        path = path / "mutants.out"
    result = {}
    for outcome in json.loads((path / "outcomes.json").read_text())["outcomes"]:
        if outcome["scenario"] == "Baseline":
            continue
        mutant = outcome["scenario"]["Mutant"]
        result[mutant["name"]] = (mutant["file"], KINDS.get(outcome["summary"], outcome["summary"]))
    return result


def table(title, merged):
    per_file = collections.defaultdict(collections.Counter)
    for file, kind in merged.values():
        per_file[file][kind] += 1
    print(f"\n{title}\n")
    print("| file | mutants | caught | missed | unviable | timeout |")
    print("|---|---|---|---|---|---|")
    total = collections.Counter()
    for file in sorted(per_file):
        c = per_file[file]
        total.update(c)
        print(f"| `{file}` | {sum(c.values())} | {c['caught']} | {c['missed']} | {c['unviable']} | {c['timeout']} |")
    print(f"| **total** | {sum(total.values())} | {total['caught']} | {total['missed']} | {total['unviable']} | {total['timeout']} |")


args = sys.argv[1:]
if args and args[0] == "--merge":
    merged = {}
    for arg in args[1:]:
        merged.update(outcomes(arg))
    table(" + ".join(args[1:]), merged)
else:
    for arg in args:
        table(arg, outcomes(arg))
