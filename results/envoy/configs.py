#!/usr/bin/env python3
"""The configs of bench.sh's rows, written from the tested ones by substitution.

    configs.py envoy ROW OUT --listen P --admin P --upstream P [--rls P] [--rls-timeout 1s]
    configs.py tollgate OUT --grpc P --http P [--redis URL --mode per_request|lease]
    configs.py limitador OUT

Envoy: crates/server/examples/envoy/envoy.yaml (the file crates/server/tests/envoy.rs runs) with
its four ports replaced, as the test does (each `port_value: N ` must occur once), and the
rate-limit filter's call timeout set to --rls-timeout. Then per row:
  a       the ratelimit filter removed (the route's rate_limits stay, unused: no filter reads them)
  b       the ratelimit filter replaced by Envoy's local_ratelimit (one token bucket, 1e9 tokens/s)
  c d e   the file as tested: three descriptors per request to the RLS at --rls

tollgate-server and limitador get the same three rules, one per descriptor the route sends, at
1e9 per second each, so nothing is denied (the check path is measured, not 429s). For `GET /`
from one client two of them count (per_ip on descriptor 0, global on descriptor 2); login needs
a /login path. All are GCRA in tollgate-server (lease mode runs GCRA only).
"""

import argparse
import sys

EXAMPLE = "crates/server/examples/envoy/envoy.yaml"
LIMIT = 1_000_000_000  # per second, every rule: far above what one machine can send

RATELIMIT_FILTER_START = "          - name: envoy.filters.http.ratelimit\n"
ROUTER_FILTER_START = "          - name: envoy.filters.http.router\n"
RLS_TIMEOUT = "\n              timeout: 0.25s "

LOCAL_RATELIMIT_FILTER = """\
          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: local_rate_limiter
              token_bucket: {{ max_tokens: {limit}, tokens_per_fill: {limit}, fill_interval: 1s }}
              filter_enabled:
                runtime_key: local_rate_limit_enabled
                default_value: {{ numerator: 100, denominator: HUNDRED }}
              filter_enforced:
                runtime_key: local_rate_limit_enforced
                default_value: {{ numerator: 100, denominator: HUNDRED }}
""".format(limit=LIMIT)


def once(text, needle, what):
    n = text.count(needle)
    if n != 1:
        sys.exit(f"configs.py: {what}: {needle!r} occurs {n} times in {EXAMPLE}, expected once")


def envoy(args):
    with open(EXAMPLE) as f:
        yaml = f.read()
    rls = args.rls if args.rls is not None else 1  # rows a and b call no RLS; the cluster stays
    for frm, to in [(10000, args.listen), (9901, args.admin), (8081, rls), (8000, args.upstream)]:
        frm = f"port_value: {frm} "
        once(yaml, frm, "port")
        yaml = yaml.replace(frm, f"port_value: {to} ")
    once(yaml, RLS_TIMEOUT, "the filter's timeout")
    yaml = yaml.replace(RLS_TIMEOUT, f"\n              timeout: {args.rls_timeout} ")
    row = args.row[0]
    if row in "ab":
        once(yaml, RATELIMIT_FILTER_START, "the ratelimit filter")
        once(yaml, ROUTER_FILTER_START, "the router filter")
        start = yaml.index(RATELIMIT_FILTER_START)
        end = yaml.index(ROUTER_FILTER_START)
        yaml = yaml[:start] + (LOCAL_RATELIMIT_FILTER if row == "b" else "") + yaml[end:]
    elif row not in "cde":
        sys.exit(f"configs.py: unknown row {args.row}")
    elif args.rls is None:
        sys.exit(f"configs.py: row {args.row} needs --rls")
    return yaml


def tollgate(args):
    backend = ""
    if args.redis:
        # timeout 1 s: a slow answer under load is measured, not turned into a fail-closed denial.
        backend = (
            f'backend = {{ redis = {{ url = "{args.redis}", mode = "{args.mode}", timeout = "1s" }} }}\n'
        )
    rules = [
        ("per_ip", '{ remote_address = "any" }', '["remote_address"]'),
        ("login", '{ remote_address = "any", path = { prefix = "/login" } }', '["remote_address"]'),
        ("global", '{ generic_key = { exact = "global" } }', None),
    ]
    out = [
        "[server]",
        f'grpc = "127.0.0.1:{args.grpc}"',
        f'http = "127.0.0.1:{args.http}"',
        'reload_poll = "0s"',
        "",
        "[[domains]]",
        'name = "edge"',
        backend,
        "[domains.policy]",
    ]
    for name, match, key in rules:
        out += ["[[domains.policy.rules]]", f'name = "{name}"', f"match = {match}"]
        if key:
            out += [f"key = {key}", "capacity = 1000"]
        out += [f"limit = {LIMIT}", 'period = "1s"', ""]
    return "\n".join(out)


def limitador(_args):
    # limitador binds one context per request: descriptors[i] is the i-th descriptor Envoy sends.
    return f"""\
- namespace: edge
  max_value: {LIMIT}
  seconds: 1
  conditions: []
  variables: ["descriptors[0].remote_address"]
- namespace: edge
  max_value: {LIMIT}
  seconds: 1
  conditions: ["descriptors[1].path == '/login'"]
  variables: ["descriptors[1].remote_address"]
- namespace: edge
  max_value: {LIMIT}
  seconds: 1
  conditions: ["descriptors[2].generic_key == 'global'"]
  variables: []
"""


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("envoy")
    e.add_argument("row")
    e.add_argument("out")
    for port in ["listen", "admin", "upstream"]:
        e.add_argument(f"--{port}", type=int, required=True)
    e.add_argument("--rls", type=int)
    e.add_argument("--rls-timeout", default="1s")
    t = sub.add_parser("tollgate")
    t.add_argument("out")
    t.add_argument("--grpc", type=int, required=True)
    t.add_argument("--http", type=int, required=True)
    t.add_argument("--redis")
    t.add_argument("--mode", default="per_request", choices=["per_request", "lease"])
    lim = sub.add_parser("limitador")
    lim.add_argument("out")
    args = p.parse_args()
    text = {"envoy": envoy, "tollgate": tollgate, "limitador": limitador}[args.what](args)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
