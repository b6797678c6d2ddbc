#!/usr/bin/env python3
"""The README's tables from the raw runs in run*/: total decisions per second (millions) per thread
count, one cell per run ("run1 / run2"), and per run Tollgate's time per decision over the peer's
(governor's throughput over Tollgate's: below 1, Tollgate is faster), as everywhere in results/.
    python3 results/manycore/summary.py
"""
import json
import pathlib
import re

HERE = pathlib.Path(__file__).parent
RUNS = sorted(p for p in HERE.glob("run*") if p.is_dir())
THREADS = (1, 2, 4, 8, 16)


def loadgen(run):
    rows = {}
    for r in json.loads((run / "suite.json").read_text())["records"]:
        rows[(r["scenario"].split("/", 1)[1], r["impl"], r["threads"])] = r["decisions_per_sec"] / 1e6
    return rows


def criterion(run):
    rows = {}
    for name in ("keyed.txt", "policy.txt"):
        text = (run / name).read_text()
        for m in re.finditer(r"^(\S+)/(\d+)\n\s+time:\s+\[\S+ \S+ (\S+) (\S+)", text, re.M):
            ns = float(m.group(3)) * {"ns": 1, "µs": 1e3, "ms": 1e6}[m.group(4)]
            threads = int(m.group(2))
            rows[(m.group(1), threads)] = threads * 1e3 / ns  # one decision per thread per iteration
    return rows


def cells(values, digits=1):
    return " / ".join(f"{v:.{digits}f}" for v in values)


def table(title, rows, ratios):
    print(f"\n### {title}\n")
    print("| row | " + " | ".join(f"{t} thr" for t in THREADS) + " |")
    print("|---|" + "---:|" * len(THREADS))
    for label, get in rows:
        print(f"| {label} | " + " | ".join(cells(get(t)) for t in THREADS) + " |")
    for label, ours, theirs in ratios:
        print(f"| **{label}** | " + " | ".join(
            cells((b / a for a, b in zip(ours(t), theirs(t))), 2) + "×" for t in THREADS) + " |")


lg = [loadgen(r) for r in RUNS]
cr = [criterion(r) for r in RUNS]


def L(scenario, impl):
    return lambda t: [run[(scenario, impl, t)] for run in lg]


def C(name):
    return lambda t: [run[(name, t)] for run in cr]


for quota in ("allow", "deny"):
    table(f"Load generator, {quota}, one key (M decisions/s, all threads)", [
        ("gcra", L(f"{quota}/single", "gcra")),
        ("striped", L(f"{quota}/single", "striped")),
        ("governor", L(f"{quota}/single", "governor")),
        ("keyed_gcra, one key", L(f"{quota}/single", "keyed_gcra")),
        ("governor_keyed, one key", L(f"{quota}/single", "governor_keyed")),
    ], [
        ("gcra ÷ governor", L(f"{quota}/single", "gcra"), L(f"{quota}/single", "governor")),
        ("striped ÷ governor", L(f"{quota}/single", "striped"), L(f"{quota}/single", "governor")),
        ("keyed ÷ governor_keyed", L(f"{quota}/single", "keyed_gcra"), L(f"{quota}/single", "governor_keyed")),
    ])
    table(f"Load generator, {quota}, 1 M keys uniform, prefilled (M decisions/s)", [
        ("keyed_gcra", L(f"{quota}/uniform:1000000", "keyed_gcra")),
        ("governor_keyed", L(f"{quota}/uniform:1000000", "governor_keyed")),
    ], [
        ("keyed ÷ governor_keyed", L(f"{quota}/uniform:1000000", "keyed_gcra"),
         L(f"{quota}/uniform:1000000", "governor_keyed")),
    ])

for group in ("keyed/hot_key", "keyed/hot_half_1m_cold"):
    table(f"Criterion `{group}` (M decisions/s)", [
        (impl, C(f"{group}/{impl}")) for impl in ("tollgate", "tollgate_promoted", "tollgate_check_keys", "governor")
    ], [
        ("promoted ÷ governor", C(f"{group}/tollgate_promoted"), C(f"{group}/governor")),
        ("promoted ÷ plain", C(f"{group}/tollgate_promoted"), C(f"{group}/tollgate")),
    ])

table("Criterion `policy/threads` (M decisions/s)", [
    ("policy_three_rules", C("policy/threads/policy_three_rules")),
    ("governor_three_checks", C("policy/threads/governor_three_checks")),
], [
    ("policy ÷ governor", C("policy/threads/policy_three_rules"), C("policy/threads/governor_three_checks")),
])
