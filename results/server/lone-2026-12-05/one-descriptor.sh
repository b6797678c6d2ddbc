#!/usr/bin/env bash
# one descriptor per call (remote_address), 1 stream, tollgate-server (results/server/embedded.toml, --workers 1)
# vs limitador memory (one limit), interleaved
# Run from anywhere after the release build (target/release/tollgate-server, rls-load); prints each
# run's calls/s, latency and server CPU. Wrapped in awake.sh for the "kept awake" figures.
set -u
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
L=${LIMITADOR:-/work/peers/limitador/target/release/limitador-server}
tmp=$(mktemp -d)
mkdir -p "$tmp/lim"
# limitador watches its limits file's directory: the file gets one of its own.
cp results/server/lone-2026-12-05/limitador-one-limit.yaml "$tmp/lim/limits.yaml"
for rep in 1 2 3; do
  target/release/tollgate-server --config results/server/embedded.toml --grpc 127.0.0.1:18081 --http 127.0.0.1:18080 --workers 1 >"$tmp/tg.log" 2>&1 & tp=$!
  sleep 1
  echo "tollgate rep $rep"; target/release/rls-load --target http://127.0.0.1:18081 --streams 1 --channels 2 --threads 1 --keys 100 --warmup 1s --duration 5s --server-pid $tp 2>&1 | grep -E "calls/s|p50|server cpu"
  kill $tp; wait $tp 2>/dev/null
  $L -b 127.0.0.1 -p 18091 -B 127.0.0.1 -P 18092 "$tmp/lim/limits.yaml" memory >"$tmp/lim.log" 2>&1 & lp=$!
  sleep 1
  echo "limitador rep $rep"; target/release/rls-load --target http://127.0.0.1:18091 --streams 1 --channels 2 --threads 1 --keys 100 --warmup 1s --duration 5s --server-pid $lp 2>&1 | grep -E "calls/s|p50|server cpu"
  kill $lp; wait $lp 2>/dev/null
done
