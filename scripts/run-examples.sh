#!/usr/bin/env bash
# Runs every example the guides point to, the way a reader would, and checks what each one says it
# shows. Servers are started on free loopback ports, stopped by PID, and each wait is bounded.
# Needs curl and redis-server (scripts/test-all.sh installs the latter).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
# Waits (at most 60 s) for a started program to print its "listening" line into its log.
wait_listening() {
  for _ in $(seq 600); do grep -q "listening" "$1" && return 0; sleep 0.1; done
  echo "not listening after 60 s: $1" >&2; cat "$1" >&2; return 1
}
statuses() { # URL, count, extra curl args: one status code per request, on one connection
  local url=$1 n=$2; shift 2
  local urls=(); for _ in $(seq "$n"); do urls+=(-o /dev/null "$url"); done
  curl -s -w '%{http_code} ' "$@" "${urls[@]}"
}

step "the retry client (tollgate-client)"
cargo run -q --locked -p tollgate-client --example retry

step "a policy file (tollgate-policy)"
cargo run -q --locked -p tollgate-policy --example policy_file

step "a Redis fleet of two processes (tollgate-redis)"
cargo run -q --locked -p tollgate-redis --example fleet

step "a keyed limit in axum (tollgate-http)"
cargo build -q --locked -p tollgate-http --example server
cargo build -q --locked -p tollgate-pingora --example proxy
log=$(mktemp)
app_port=$(free_port)
target/debug/examples/server "127.0.0.1:$app_port" >"$log" 2>&1 &
pids+=($!)
wait_listening "$log"
got=$(statuses "http://127.0.0.1:$app_port/search" 4)
echo "GET /search x4: $got"
[ "$got" = "200 200 200 429 " ] || { echo "expected three 200s then a 429 (3 per minute)" >&2; exit 1; }

step "the Pingora proxy (tollgate-pingora) in front of the axum example"
policy=$(mktemp --suffix .toml)
cat >"$policy" <<'TOML'
[[rules]]
name = "per_key"
match = { client_key = "any" }
key = ["client_key"]
limit = 2
period = "1m"
capacity = 1000
TOML
proxy_port=$(free_port)
log=$(mktemp)
target/debug/examples/proxy --listen "127.0.0.1:$proxy_port" --upstream "127.0.0.1:$app_port" \
  --policy "$policy" --key-header x-client-key >"$log" 2>&1 &
pids+=($!)
wait_listening "$log"
got=$(statuses "http://127.0.0.1:$proxy_port/hello" 3 -H 'x-client-key: alice')
echo "GET /hello x3 as alice: $got"
[ "$got" = "200 200 429 " ] || { echo "expected two 200s then a 429 (2 per minute per key)" >&2; exit 1; }
got=$(statuses "http://127.0.0.1:$proxy_port/hello" 1 -H 'x-client-key: bob')
[ "$got" = "200 " ] || { echo "bob has a quota of his own" >&2; exit 1; }

step "every example ran"
