#!/usr/bin/env python3
"""bench.sh's runs (RAW/run-*.txt) as one Markdown table, on stdout.

    collect.py RAW_DIR

Per row and connection count, the median over the rounds of wrk's req/s, p50 and p99, and what the
row's p50 and p99 add over row (a) (no rate-limit filter) at the same connection count. `checks`
says `ok` when, in every round, no response was other than 2xx, no socket error occurred, Envoy
counted no denial, no failed RLS call and no call admitted by `failure_mode_deny: false`, and the
row's limiter was reached (an RLS row's `ratelimit.ok` counter, row b's `enabled` counter, above
0); otherwise what went wrong, summed over the rounds. Exits non-zero when a check fails.
"""

import glob
import os
import re
import statistics
import sys

WHAT = {
    "a": "no rate-limit filter",
    "b": "Envoy local_ratelimit",
    "c": "tollgate-server, embedded",
    "d-per-request": "tollgate-server, Redis per request",
    "d-lease": "tollgate-server, Redis lease",
    "e-memory": "limitador, memory",
    "e-redis": "limitador, redis",
    "e-redis-cached": "limitador, redis_cached",
}
ORDER = list(WHAT)
# Envoy's stats (envoy.yaml's names: listener stat_prefix `ingress`, route cluster `backend`;
# configs.py's local_ratelimit stat_prefix).
INGRESS = "http.ingress."
RLS = "cluster.backend.ratelimit."
LOCAL = "local_rate_limiter.http_local_rate_limit."
UNIT_US = {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0}


def micros(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if not m:
        raise ValueError(f"not a wrk latency: {text!r}")
    return float(m.group(1)) * UNIT_US[m.group(2)]


def parse(path):
    text = open(path).read()
    head = dict(kv.split("=", 1) for kv in text.splitlines()[0].split())
    wrk, _, rest = text.partition("--- envoy stats")
    stats_text, _, upstream = rest.partition("--- upstream")
    stats = {}
    for line in stats_text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and value.strip().isdigit():
            stats[name.strip()] = int(value)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", wrk)
    p50 = re.search(r"^\s+50%\s+(\S+)", wrk, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", wrk, re.M)
    if not (rps and p50 and p99):
        raise ValueError(f"{path}: no wrk result (req/s, 50%, 99%)")
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", wrk)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", wrk)
    return {
        "run": head["run"],
        "conns": int(head["conns"]),
        "rps": float(rps.group(1)),
        "p50": micros(p50.group(1)),
        "p99": micros(p99.group(1)),
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(map(int, sock.groups())) if sock else 0,
        "stats": stats,
    }


def stat(stats, name):
    return stats.get(name, 0)


def problems(row, runs):
    """What failed the checks, summed over the rounds ([] when none)."""
    s = lambda name: sum(stat(r["stats"], name) for r in runs)  # noqa: E731
    found = {
        "non-2xx": sum(r["non2xx"] for r in runs),
        "socket errors": sum(r["socket_errors"] for r in runs),
        "4xx": s(INGRESS + "downstream_rq_4xx"),
        "5xx": s(INGRESS + "downstream_rq_5xx"),
        "over_limit": s(RLS + "over_limit"),
        "rls errors": s(RLS + "error"),
        "failure_mode_allowed": s(RLS + "failure_mode_allowed"),
        "local rate_limited": s(LOCAL + "rate_limited"),
    }
    out = [f"{name} {n}" for name, n in found.items() if n]
    if row[0] in "cde" and any(stat(r["stats"], RLS + "ok") == 0 for r in runs):
        out.append("RLS not reached (ratelimit.ok 0)")
    if row == "b" and any(stat(r["stats"], LOCAL + "enabled") == 0 for r in runs):
        out.append("local_ratelimit not reached (enabled 0)")
    return out


def row_of(run):
    return run.split(".w")[0]


def label(run):
    row = row_of(run)
    what = WHAT[row]
    if ".w" in run:
        workers = run.split(".w", 1)[1]
        what += ", --workers " + workers if workers != "default" else ", workers: default (one per core)"
    return f"({row}) {what}"


def main():
    raw = sys.argv[1]
    runs = [parse(p) for p in sorted(glob.glob(os.path.join(raw, "run-*.txt")))]
    if not runs:
        sys.exit(f"collect.py: no run-*.txt in {raw}")
    groups = {}
    for r in runs:
        groups.setdefault((r["run"], r["conns"]), []).append(r)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("rps", "p50", "p99")} for k, v in groups.items()}
    keys = sorted(groups, key=lambda k: (k[1], ORDER.index(row_of(k[0])), k[0]))
    failed = False
    print("| row | conns | req/s | p50 µs | p99 µs | p50 added over (a) µs | p99 added over (a) µs | rounds | checks |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for run, conns in keys:
        m = med[(run, conns)]
        base = med.get(("a", conns))
        added = (
            (f"{m['p50'] - base['p50']:+.0f}", f"{m['p99'] - base['p99']:+.0f}")
            if base and run != "a"
            else ("", "")
        )
        bad = problems(row_of(run), groups[(run, conns)])
        failed |= bool(bad)
        print(
            f"| {label(run)} | {conns} | {m['rps']:.0f} | {m['p50']:.0f} | {m['p99']:.0f} | "
            f"{added[0]} | {added[1]} | {len(groups[(run, conns)])} | {'; '.join(bad) or 'ok'} |"
        )
    print()
    # The goal: tollgate-server embedded adds at most 100 µs p50 over (a) at 16
    # connections, and is the fastest RLS in the table.
    for conns in sorted({c for _, c in keys}):
        rls = [(run, med[(run, c)]) for run, c in keys if c == conns and row_of(run)[0] in "cde"]
        if not rls:
            continue
        by_rps = max(rls, key=lambda x: x[1]["rps"])
        by_p50 = min(rls, key=lambda x: x[1]["p50"])
        print(
            f"- {conns} connections: most req/s among the RLS rows: {label(by_rps[0])}; "
            f"lowest p50: {label(by_p50[0])}"
        )
        base = med.get(("a", conns))
        for run, m in rls:
            if row_of(run) == "c" and base and conns == 16:
                added = m["p50"] - base["p50"]
                verdict = "met" if added <= 100 else "not met"
                print(f"  - goal (at most 100 µs p50 added at 16 connections), {label(run)}: {added:+.0f} µs, {verdict}")
    if failed:
        print("\nSome rows failed their checks (see `checks`): their figures do not measure the check path.")
        sys.exit(1)


if __name__ == "__main__":
    main()
