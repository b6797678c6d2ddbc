#!/usr/bin/env bash
# The fleet path side by side (issue 26, Performance): ShouldRateLimit calls/s, latency and CPU per
# call of tollgate-server and limitador, every row with the same three limits per call (per client
# address, per address + path, global; three descriptors per call, as Envoy sends them for a route
# with three rate_limits actions), the same load client (tollgate-lab's rls-load) and a fresh
# redis-server per row, at 1 and 64 concurrent streams, REPS interleaved repetitions.
#
# Usage: results/fleet/run.sh [ROW ...]     (from anywhere inside the repository)
#   ROW (default: all, in this order):
#     tollgate_embedded        tollgate_embedded.toml, in memory
#     tollgate_per_request     tollgate_per_request.toml, one EVALSHA per call
#     tollgate_lease           tollgate_lease.toml, local leases of the shared buckets
#     tollgate_durable         tollgate_durable.toml, per request + WAIT for 1 replica (the script
#                              starts a primary and one replica; the redis CPU is the primary's)
#     limitador_memory         limitador.yaml, `memory` storage
#     limitador_redis          limitador.yaml, `redis` storage
#     limitador_redis_cached   limitador.yaml, `redis_cached` storage (its default flush settings)
#   Every Redis row gets its own redis-server on a free loopback port (--save "", --appendonly no),
#   stopped by PID when the row is done.
# Env: DURATION (10s), WARMUP (2s), REPS (3), STREAMS ("1 64"), CHANNELS (2), THREADS (client
#   runtime threads, 1), CLIENT (h2 | tonic, h2), WORKERS (tollgate-server's runtime worker threads,
#   1; "" = one per core; limitador runs with its own defaults, as a new user gets it), KEYS
#   (distinct client addresses, 100), OUT (results/fleet/raw), SERVER_BIN (default the fresh
#   build), LIMITADOR (default /work/peers/limitador/target/release/limitador-server, built from
#   its public source for measurement only).
#   A full run: 7 rows x REPS x (STREAMS x (WARMUP + DURATION) + ~2 s start and stop), about
#   7 x 3 x 26 s = 9-10 minutes with the defaults, plus the release build when it is not fresh.
#   Smoke check: DURATION=1s WARMUP=0s REPS=1 OUT=/tmp/fleet-smoke results/fleet/run.sh
#
# The release build runs first, niced and outside the lock; each load run holds /work/bench.lock
# (when that exists) so no other benchmark overlaps it. Servers, redis-servers and the client run
# at normal priority on the same machine. The summary (medians per row and the ratios issue 26
# asks for) goes to $OUT/summary.md; it exits non-zero when any run had an OVER_LIMIT answer or an
# error (every quota is far above the load, so either means the row did not measure what it says).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=results/fleet
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
REPS=${REPS:-3}
STREAMS=${STREAMS:-"1 64"}
CHANNELS=${CHANNELS:-2}
THREADS=${THREADS:-1}
CLIENT=${CLIENT:-h2}
WORKERS=${WORKERS-1}
KEYS=${KEYS:-100}
OUT=${OUT:-$here/raw}
LIMITADOR=${LIMITADOR:-/work/peers/limitador/target/release/limitador-server}

all_rows=(tollgate_embedded tollgate_per_request tollgate_lease tollgate_durable
  limitador_memory limitador_redis limitador_redis_cached)
rows=("$@")
[ ${#rows[@]} -eq 0 ] && rows=("${all_rows[@]}")
for row in "${rows[@]}"; do
  case " ${all_rows[*]} " in
    *" $row "*) ;;
    *) echo "unknown row $row (rows: ${all_rows[*]})" >&2; exit 2 ;;
  esac
done
case " ${rows[*]} " in
  *" limitador_"*) [ -x "$LIMITADOR" ] || { echo "no limitador-server at $LIMITADOR" >&2; exit 2; } ;;
esac

mkdir -p "$OUT"

# The calls' descriptors and free_port, as pairs.sh and instructions.sh use them.
source "$here/common.sh"

CARGO_INCREMENTAL=0 nice -n 19 cargo build --release -p tollgate-server -p tollgate-lab \
  --bin tollgate-server --bin rls-load --locked
server_bin=${SERVER_BIN:-target/release/tollgate-server}
load_bin=target/release/rls-load

lock() {
  if [ -e /work/bench.lock ]; then flock /work/bench.lock "$@"; else "$@"; fi
}

# Whether something accepts TCP connections on 127.0.0.1:$1.
listening() {
  python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1",int(sys.argv[1])),0.2).close()' "$1" 2>/dev/null
}

{
  echo "command: results/fleet/run.sh ${rows[*]} (DURATION=$DURATION WARMUP=$WARMUP REPS=$REPS STREAMS=\"$STREAMS\" CHANNELS=$CHANNELS THREADS=$THREADS CLIENT=$CLIENT WORKERS=\"$WORKERS\" KEYS=$KEYS)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (+ uncommitted changes under crates/)')"
  echo "server binary: $server_bin ($(sha256sum "$server_bin" | cut -c1-12))"
  if [ -x "$LIMITADOR" ]; then
    echo "limitador: $LIMITADOR ($("$LIMITADOR" --version 2>&1 | head -1); $(sha256sum "$LIMITADOR" | cut -c1-12)), its default threads"
  fi
  echo "redis-server: $(redis-server --version)"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /cpu: /'
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"

# Whether process $1 runs (an exited child stays a zombie, state Z, until it is reaped).
alive() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$state" ] && [ "$state" != Z ]
}

# Stops process $1 (SIGTERM, then SIGKILL after 10 s) and reaps it; a SIGKILL is noted in
# $OUT/stops.txt, since a row that does not stop cleanly is worth knowing about.
stop() {
  local pid=$1 name=$2
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    alive "$pid" || break
    sleep 0.1
  done
  if alive "$pid"; then
    echo "$name (pid $pid) did not stop within 10 s of SIGTERM: SIGKILL" | tee -a "$OUT/stops.txt" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

server_pid=""
redis_pid=""
replica_pid=""
cleanup() {
  [ -n "$server_pid" ] && stop "$server_pid" server
  [ -n "$replica_pid" ] && stop "$replica_pid" replica
  [ -n "$redis_pid" ] && stop "$redis_pid" redis-server
  server_pid=""
  redis_pid=""
  replica_pid=""
}
trap cleanup EXIT

# A redis-server on a free loopback port: sets redis_pid and redis_port.
start_redis() {
  local row=$1
  redis_port=$(free_port)
  # No diskless-sync delay: a replica (tollgate_durable) syncs at once.
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --repl-diskless-sync-delay 0 >"$OUT/$row.redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis-server for $row did not start" >&2
  cat "$OUT/$row.redis.log" >&2
  exit 1
}

# One replica of the redis-server on $redis_port, started and in sync: sets replica_pid.
start_replica() {
  local row=$1 port
  port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --replicaof 127.0.0.1 "$redis_port" --repl-diskless-load on-empty-db \
    >"$OUT/$row.replica.log" 2>&1 &
  replica_pid=$!
  for _ in $(seq 100); do
    if redis-cli -p "$port" info replication 2>/dev/null | grep -q 'master_link_status:up' &&
      redis-cli -p "$redis_port" info replication 2>/dev/null | grep -q 'connected_slaves:1'; then
      # The primary streams nothing to a freshly synced replica (a WAIT's GETACK included) until
      # the replica's first REPLCONF ACK, sent once a second (guides/redis.md, durable): one write
      # confirmed before the row starts, so that its first WAITs do not time out for that reason.
      # (1 s runs without warm-up still saw 7-8 fail-closed calls in three of four; the 2 s
      # warm-up hides them; not explained.)
      redis-cli -p "$redis_port" set tollgate:fleet:ready 1 >/dev/null
      [ "$(redis-cli -p "$redis_port" wait 1 3000)" = 1 ] && return 0
      break
    fi
    sleep 0.1
  done
  echo "the replica for $row did not sync" >&2
  cat "$OUT/$row.replica.log" >&2
  exit 1
}

# tollgate-server on $1's config (its Redis URL filled in): sets server_pid and grpc.
start_tollgate() {
  local row=$1 run_config="$OUT/$1.run.toml"
  cp "$here/$row.toml" "$run_config"
  if grep -q 'REDIS_URL_PLACEHOLDER' "$run_config"; then
    sed -i "s#REDIS_URL_PLACEHOLDER#redis://127.0.0.1:$redis_port/#" "$run_config"
  fi
  # Truncated here, not by the child's redirection: that may happen after the read below, which
  # would then find the previous repetition's address.
  : > "$OUT/$row.server.out"
  local workers=()
  [ -n "$WORKERS" ] && workers=(--workers "$WORKERS")
  "$server_bin" --config "$run_config" "${workers[@]}" >>"$OUT/$row.server.out" 2>"$OUT/$row.server.log" &
  server_pid=$!
  grpc=""
  for _ in $(seq 100); do
    grpc=$(sed -n 's/^grpc listening on //p' "$OUT/$row.server.out")
    [ -n "$grpc" ] && return 0
    sleep 0.1
  done
  echo "tollgate-server for $row did not start" >&2
  cat "$OUT/$row.server.log" >&2
  exit 1
}

# limitador-server with limitador.yaml and storage $2 (its Redis URL filled in): sets server_pid
# and grpc.
start_limitador() {
  local row=$1 storage=$2 rls_port http_port
  # limitador watches its limits file's whole directory for changes (hot reload): the file gets a
  # directory of its own, where this script writes nothing else while the row runs.
  local limits_dir="$OUT/$row.limits"
  mkdir -p "$limits_dir"
  cp "$here/limitador.yaml" "$limits_dir/limits.yaml"
  local store=("$storage")
  [ "$storage" != memory ] && store+=("redis://127.0.0.1:$redis_port")
  rls_port=$(free_port)
  http_port=$(free_port)
  "$LIMITADOR" -b 127.0.0.1 -p "$rls_port" -B 127.0.0.1 -P "$http_port" \
    "$limits_dir/limits.yaml" "${store[@]}" >"$OUT/$row.server.log" 2>&1 &
  server_pid=$!
  grpc="127.0.0.1:$rls_port"
  for _ in $(seq 100); do
    listening "$rls_port" && return 0
    alive "$server_pid" || break
    sleep 0.1
  done
  echo "limitador-server for $row did not start" >&2
  cat "$OUT/$row.server.log" >&2
  exit 1
}

# Repetitions outer, rows inner: each repetition runs every row once (a fresh redis-server and
# server each), so a change in the machine's load over the minutes hits every row alike.
for rep in $(seq "$REPS"); do
  for row in "${rows[@]}"; do
    other=()
    case $row in
      tollgate_embedded | limitador_memory) ;;
      tollgate_durable) start_redis "$row"; start_replica "$row"; other=(--other-pid "$redis_pid") ;;
      *) start_redis "$row"; other=(--other-pid "$redis_pid") ;;
    esac
    case $row in
      tollgate_*) start_tollgate "$row" ;;
      limitador_*) start_limitador "$row" "${row#limitador_}" ;;
    esac
    for streams in $STREAMS; do
      json="$OUT/$row-s$streams-r$rep.json"
      echo "== $row streams=$streams rep=$rep (load $(cut -d' ' -f1 /proc/loadavg))"
      lock "$load_bin" --target "http://$grpc" --domain edge --streams "$streams" \
        --channels "$CHANNELS" --threads "$THREADS" --client "$CLIENT" --keys "$KEYS" \
        "${descriptors[@]}" --server-pid "$server_pid" "${other[@]}" \
        --warmup "$WARMUP" --duration "$DURATION" --json "$json"
    done
    {
      grep VmRSS "/proc/$server_pid/status" || true
      echo "threads: $(ls "/proc/$server_pid/task" 2>/dev/null | wc -l)"
    } > "$OUT/$row-r$rep.server-rss.txt"
    cleanup
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

python3 "$here/summary.py" "$OUT" | tee "$OUT/summary.md"
