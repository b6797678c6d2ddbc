#!/usr/bin/env python3
"""Tabulates the A/B of the load generator's method: 1510e21 (`old`: no prefill, 64 Ki i.i.d. key
streams) against this branch (`new`: prefilled tables, covering streams), alternated twice per clock.

    python3 results/suite/method-ab/summarise.py > results/suite/method-ab/table.md
"""
import collections
import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
cells = collections.defaultdict(dict)
headers = {}
for path in sorted(glob.glob(os.path.join(HERE, "*", "suite.json"))):
    version, clock, rep = os.path.basename(os.path.dirname(path)).split("-")
    data = json.load(open(path))
    headers[(version, clock, rep)] = data["header"]
    for r in data["records"]:
        key = (clock, r["impl"], r["quota_mode"], r["key_dist"], r["threads"])
        cells[key][(version, rep)] = r

print("| clock | impl | quota | keys | threads | old ns (2 runs) | new ns (2 runs) | old distinct keys in stream | new |")
print("|---|---|---|---|---:|---|---|---:|---:|")
for key in sorted(cells):
    c = cells[key]
    ns = lambda v: " · ".join(f"{c[(v, rep)]['ns_per_decision']:.1f}" for rep in "12" if (v, rep) in c)
    keys = c.get(("new", "1"), {}).get("stream_keys", "–")
    old_keys = "?"
    if key[3].startswith("uniform:") or key[3].startswith("zipf:"):
        # The old tool did not record coverage; its stream was 64 Ki i.i.d. draws (see keys.rs tests).
        old_keys = "≤ 65 536"
    elif key[3] == "single":
        old_keys = "1"
    print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {ns('old')} | {ns('new')} | {old_keys} | {keys} |")
print()
for (version, clock, rep), h in sorted(headers.items()):
    built = "binary built from `git archive 1510e21`" if version == "old" else "binary built from this tree"
    print(f"- {version}-{clock}-{rep}: {built}; run from the worktree at `{h['git_commit']}`"
          f"{' (dirty: a doc comment)' if h['git_dirty'] else ''}, "
          f"{h['date_utc']}, load {h['loadavg_before']} → {h['loadavg_after']}")
