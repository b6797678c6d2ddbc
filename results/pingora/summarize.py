#!/usr/bin/env python3
"""Tables for results/pingora from run.sh's raw files (usage: summarize.py RAW_DIR > tables.md)."""
import glob
import math
import os
import re
import statistics
import sys

raw = sys.argv[1]
MODES = ["none", "pingora-limits", "keyed", "policy"]


def parse(path):
    text = open(path).read()
    head = dict(re.findall(r"(\w+)=(\S+)", text.splitlines()[0]))
    m = re.search(r"^RESULT (.*)$", text, re.M)
    if not m:
        return None
    r = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", m.group(1))}
    r.update(head)
    for key in ("rss_after_kb", "hwm_kb"):
        mm = re.search(rf"^{key}=(\d+)", text, re.M)
        r[key] = int(mm.group(1)) if mm else None
    counts = text.split("--- upstream counts", 1)[1] if "--- upstream counts" in text else ""
    r["hist"] = [tuple(map(int, x)) for x in re.findall(r"^hist (\d+) (\d+)$", counts, re.M)]
    for key in ("total", "other", "keys_seen", "max"):
        mm = re.search(rf"^{key} (\d+)$", counts, re.M)
        r["up_" + key] = int(mm.group(1)) if mm else None
    r["secs_run"] = r["duration_us"] / 1e6
    r["rps"] = r["requests"] / r["secs_run"]
    return r


def med(xs):
    return statistics.median(xs)


# ----------------------------------------------------------------------------------- perf
perf = {}
for path in sorted(glob.glob(os.path.join(raw, "perf-*.txt"))):
    r = parse(path)
    if r is None:
        print(f"<!-- no RESULT in {os.path.basename(path)} -->")
        continue
    perf.setdefault((r["mode"], int(r["keys"]), int(r["conns"])), []).append(r)

print("## Throughput and latency (every request admitted)\n")
print("Medians over the repetitions (n = runs). `added p50` = median p50 minus the no-limiter")
print("median p50 of the same keys/connections; `added 1/thr` = 1/(req/s) minus the no-limiter's,")
print("in µs of wall time per request for the whole proxy (2 worker threads). `spread` columns:")
print("max - min over the repetitions, the resolution these rows have.\n")
print("| keys | conns | mode | n | req/s | req/s spread | p50 µs | p50 spread | p99 µs | added p50 µs | added 1/thr µs | RSS MiB | HWM MiB | non-2xx |")
print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for keys in sorted({k for (_, k, _) in perf}):
    for conns in sorted({c for (_, k, c) in perf if k == keys}):
        base = perf.get(("none", keys, conns))
        base_p50 = med([r["p50_us"] for r in base]) if base else None
        base_inv = med([1e6 / r["rps"] for r in base]) if base else None
        for mode in MODES:
            rs = perf.get((mode, keys, conns))
            if not rs:
                continue
            rps = [r["rps"] for r in rs]
            p50 = [r["p50_us"] for r in rs]
            p99 = [r["p99_us"] for r in rs]
            inv = med([1e6 / x for x in rps])
            rss = [r["rss_after_kb"] / 1024 for r in rs if r["rss_after_kb"]]
            hwm = [r["hwm_kb"] / 1024 for r in rs if r["hwm_kb"]]
            non2xx = sum(int(r["non2xx"]) for r in rs)
            added_p50 = f"{med(p50) - base_p50:+.0f}" if base and mode != "none" else ""
            added_inv = f"{inv - base_inv:+.2f}" if base and mode != "none" else ""
            print(
                f"| {keys} | {conns} | {mode} | {len(rs)} | {med(rps):,.0f} | {max(rps) - min(rps):,.0f} "
                f"| {med(p50):.0f} | {max(p50) - min(p50):.0f} | {med(p99):.0f} | {added_p50} | {added_inv} "
                f"| {med(rss):.1f} | {med(hwm):.1f} | {non2xx} |"
            )

# ------------------------------------------------------------------------------- accuracy
print("\n## Accuracy (admitted per key, counted by the upstream)\n")
print("`offered/key` = wrk's requests / keys; keys.lua sends the keys round-robin, so each key gets")
print("that many (±1) evenly spaced, at `rate/key` per second. Where `rate/key` is below the limit, a")
print("per-key limiter with no error admits every request: there `admitted/offered` below 1 is")
print("over-denial, caused for the sketch by over-counting (other keys' requests in its cells).")
print("Per-key bound over a run of T s: Tollgate GCRA admits at most burst + limit × T (burst =")
print("limit); pingora-limits' `Rate` at most limit per 1 s window, limit × (⌈T⌉ + 1) over the")
print("windows a run touches. `keys > bound` counts keys admitted past it (over-admission). The")
print("upstream also counts requests still in flight when wrk stops (at most one per connection),")
print("so `admitted` can exceed wrk's count by a few.\n")
print("| limit/s | keys | mode | T s | offered | offered/key | rate/key /s | admitted | admitted/offered | admitted/key mean | max/key | bound/key | keys > bound |")
print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
acc = []
for path in sorted(glob.glob(os.path.join(raw, "acc-*.txt"))):
    r = parse(path)
    if r is not None:
        acc.append(r)
order = {m: i for i, m in enumerate(MODES)}
acc.sort(key=lambda r: (int(r["limit"]), int(r["keys"]), order.get(r["mode"], 9)))
for r in acc:
    keys, limit, t = int(r["keys"]), int(r["limit"]), r["secs_run"]
    if r["mode"] == "pingora-limits":
        bound = limit * (math.ceil(t) + 1)
    else:
        bound = math.floor(limit + limit * t)
    admitted = sum(a * n for a, n in r["hist"])
    over = sum(n for a, n in r["hist"] if a > bound)
    offered = int(r["requests"])
    per_key = offered / keys
    print(
        f"| {limit} | {keys} | {r['mode']} | {t:.1f} | {offered:,} | {per_key:,.2f} | {per_key / t:,.2f} "
        f"| {admitted:,} | {admitted / offered:.3f} | {admitted / keys:,.2f} | {r['up_max']} | {bound} | {over} |"
    )

# ------------------------------------------------------------------------- in-process decide
micro = {}
for path in sorted(glob.glob(os.path.join(raw, "micro-*.txt"))):
    label = os.path.basename(path)[len("micro-"):-len(".txt")]
    current = label
    for line in open(path):
        if line.startswith("=== "):
            current = f"{label}: {line.split()[1]}"
            continue
        m = re.match(r"MICRO mode=(\S+) keys=(\d+) rep=\d+ ns_per_op=([\d.]+)", line)
        if m:
            micro.setdefault(current, {}).setdefault((m.group(1), int(m.group(2))), []).append(float(m.group(3)))
if micro:
    print("\n## In-process decision cost (`bench decide`, one thread, no server)\n")
    print("ns per request, median over the repetitions (n per cell in brackets); `+` = minus the `none`")
    print("loop of the same set and keys (a header insert and get per iteration).\n")
    print("| set | keys | none ns | pingora-limits + ns | keyed + ns | policy + ns |")
    print("|---|---:|---:|---:|---:|---:|")
    for label in sorted(micro):
        cells = micro[label]
        for keys in sorted({k for (_, k) in cells}):
            base = med(cells[("none", keys)])
            row = [f"{base:.0f} [{len(cells[('none', keys)])}]"]
            for mode in ("pingora-limits", "keyed", "policy"):
                xs = cells.get((mode, keys))
                row.append(f"{med(xs) - base:+.0f} [{len(xs)}]" if xs else "")
            print(f"| {label} | {keys} | " + " | ".join(row) + " |")
