#!/usr/bin/env bash
# Side by side through a real Envoy (issue 27 item 5): wrk -> Envoy -> a loopback upstream, with
# each rate-limit check in Envoy's path, at 1, 16 and 64 connections.
#
#   results/envoy/bench.sh                                  # the whole run (see README.md for its time)
#   BUILD=debug DURATION=2s WARMUP=1s REPS=1 CONNS=1 RAW=/tmp/envoy-smoke results/envoy/bench.sh
#                                                           # smoke: every row runs; no figures
#
# Rows (ROWS, in this order; every row gets a fresh stack: upstream, RLS (and Redis), Envoy):
#   a              no rate-limit filter
#   b              Envoy's own local_ratelimit filter (one token bucket)
#   c              tollgate-server, embedded (in-memory) domain
#   d-per-request  tollgate-server, Redis domain, mode = "per_request" (one script call per rule)
#   d-lease        tollgate-server, Redis domain, mode = "lease"
#   e-memory       limitador, memory storage
#   e-redis        limitador, redis storage (a Redis call per request)
#   e-redis-cached limitador, redis_cached storage (local counters flushed in batches)
# The tollgate-server rows run once per TG_WORKERS value ("default" = no --workers flag, the
# runtime's thread per core; a number N = --workers N), named c.w1, c.wdefault, ...
#
# Envoy runs crates/server/examples/envoy/envoy.yaml (the tested file) with its ports replaced and
# per-row edits (configs.py); every rule's limit is 1e9/s, so nothing is denied. Each run: WARMUP
# of wrk (discarded), Envoy's counters reset, DURATION of `wrk --latency`, then Envoy's stats and the
# upstream's count saved beside wrk's output in $RAW. The REPS rounds rotate the rows' order.
# collect.py turns $RAW into the table ($OUT_TABLE) and checks that no request was denied, failed
# or admitted by failure_mode_deny: false, and that every RLS row's RLS answered calls.
# Every process is started here on free loopback ports and stopped by PID (also on error / ^C).
# wrk runs under `flock $LOCK` (held per measured run only, waited for 15 min at most) so
# benchmarks on one machine queue.
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
REPS=${REPS:-3}
CONNS=${CONNS:-"1 16 64"}
ROWS=${ROWS:-"a b c d-per-request d-lease e-memory e-redis e-redis-cached"}
TG_WORKERS=${TG_WORKERS:-"1 default"}
WRK_THREADS=${WRK_THREADS:-1}          # at most CONNS (wrk needs a connection per thread)
ENVOY_CONCURRENCY=${ENVOY_CONCURRENCY:-1}
RLS_TIMEOUT=${RLS_TIMEOUT:-1s}         # the filter's per-call timeout (the example's is 0.25s)
ENVOY=${ENVOY:-${TOLLGATE_ENVOY:-/work/main/target/envoy-venv/lib/python3.11/site-packages/envoy/_bin/envoy}}
LIMITADOR=${LIMITADOR:-/work/peers/limitador/target/release/limitador-server}
WRK=${WRK:-wrk}
REDIS=${REDIS:-redis-server}
LOCK=${LOCK:-/work/bench.lock}
HERE=results/envoy
RAW=${RAW:-$HERE/raw}
OUT_TABLE=${OUT_TABLE:-$RAW/table.md}
BUILD=${BUILD:-release}                # or debug: a quicker build for a smoke run, never for figures
TG=${CARGO_TARGET_DIR:-target}/$BUILD/tollgate-server
UPSTREAM=${CARGO_TARGET_DIR:-target}/$BUILD/pingora-bench   # its `upstream` role: hyper, one thread, counts requests

secs() { # a wrk duration (2s, 1m, 500ms) in whole seconds, rounded up
  case $1 in *ms) echo $(( (${1%ms} + 999) / 1000 )) ;; *s) echo "${1%s}" ;; *m) echo $(( ${1%m} * 60 )) ;; *h) echo $(( ${1%h} * 3600 )) ;; *) echo "$1" ;; esac
}

# Checks before anything starts.
[ -x "$ENVOY" ] || { echo "no Envoy at $ENVOY (set ENVOY)" >&2; exit 1; }
command -v "$WRK" >/dev/null || { echo "no wrk (set WRK)" >&2; exit 1; }
for r in $ROWS; do
  case $r in
    a|b|c|d-per-request|d-lease|e-memory|e-redis|e-redis-cached) ;;
    *) echo "unknown row $r" >&2; exit 1 ;;
  esac
  case $r in
    d-*|e-redis*) command -v "$REDIS" >/dev/null || { echo "row $r needs redis-server" >&2; exit 1; } ;;
  esac
  case $r in
    e-*) [ -x "$LIMITADOR" ] || { echo "row $r needs limitador-server at $LIMITADOR: results/envoy/build-limitador.sh" >&2; exit 1; } ;;
  esac
done

case $BUILD in release) profile=(--release) ;; debug) profile=() ;; *) echo "BUILD is release or debug" >&2; exit 1 ;; esac
CARGO_INCREMENTAL=0 nice -n 15 cargo build "${profile[@]}" --locked -p tollgate-server -p tollgate-lab \
  --bin tollgate-server --bin pingora-bench >&2

mkdir -p "$RAW"
rm -f "$RAW"/run-* "$RAW"/table.md "$RAW"/machine.txt   # this script's own files only
WORK=$(mktemp -d /tmp/envoy-bench.XXXXXX)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() { # port: until it accepts a connection (bounded: 20 s)
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$1 after 20 s" >&2
  return 1
}

wait_http() { # url: until it answers 200 (bounded: 20 s)
  for _ in $(seq 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ] && return 0
    sleep 0.1
  done
  echo "no 200 from $1 after 20 s" >&2
  return 1
}

PIDS=()
stop_all() { # every process this script started, by PID, newest first
  local i
  for (( i=${#PIDS[@]}-1; i>=0; i-- )); do
    kill "${PIDS[i]}" 2>/dev/null || true
  done
  for (( i=${#PIDS[@]}-1; i>=0; i-- )); do
    # bounded: 10 s, then SIGKILL
    for _ in $(seq 100); do kill -0 "${PIDS[i]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  PIDS=()
}
cleanup() {
  local status=$?
  stop_all
  if [ "$status" != 0 ]; then # the failed stack's logs, before they go
    for f in "$WORK"/*/*.log; do [ -s "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The rows as run: tollgate-server rows once per worker setting.
RUNS=()
for r in $ROWS; do
  case $r in
    c|d-*) for w in $TG_WORKERS; do RUNS+=("$r.w$w"); done ;;
    *) RUNS+=("$r") ;;
  esac
done

# start_stack RUN: upstream, Redis and the RLS as the row needs, Envoy; sets ADMIN and LISTEN.
start_stack() {
  local run=$1 row=${1%%.w*} dir=$WORK/$1 up rls="" redis_url="" workers=()
  mkdir -p "$dir"
  up=$(free_port)
  "$UPSTREAM" upstream --listen "127.0.0.1:$up" --max-keys 1 >"$dir/upstream.log" 2>&1 &
  PIDS+=($!)
  UP_PORT=$up
  case $row in
    d-*|e-redis*)
      local rp; rp=$(free_port)
      "$REDIS" --port "$rp" --bind 127.0.0.1 --save "" --appendonly no >"$dir/redis.log" 2>&1 &
      PIDS+=($!)
      wait_port "$rp"
      redis_url="redis://127.0.0.1:$rp/"
      ;;
  esac
  case $row in
    c|d-*)
      rls=$(free_port)
      local mode=per_request
      [ "$row" = d-lease ] && mode=lease
      python3 $HERE/configs.py tollgate "$dir/tollgate.toml" --grpc "$rls" --http "$(free_port)" \
        ${redis_url:+--redis "$redis_url" --mode "$mode"}
      [ "${run##*.w}" != default ] && workers=(--workers "${run##*.w}")
      RUST_LOG=warn "$TG" --config "$dir/tollgate.toml" "${workers[@]}" >"$dir/rls.log" 2>&1 &
      PIDS+=($!)
      ;;
    e-*)
      rls=$(free_port)
      python3 $HERE/configs.py limitador "$dir/limits.yaml"
      local storage=(memory)
      [ "$row" = e-redis ] && storage=(redis "$redis_url")
      [ "$row" = e-redis-cached ] && storage=(redis_cached "$redis_url")
      RUST_LOG=warn "$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$rls" --http-ip 127.0.0.1 \
        --http-port "$(free_port)" "$dir/limits.yaml" "${storage[@]}" >"$dir/rls.log" 2>&1 &
      PIDS+=($!)
      ;;
  esac
  [ -n "$rls" ] && wait_port "$rls"
  wait_http "http://127.0.0.1:$up/__counts"
  ADMIN=$(free_port)
  LISTEN=$(free_port)
  python3 $HERE/configs.py envoy "$row" "$dir/envoy.yaml" --listen "$LISTEN" --admin "$ADMIN" \
    --upstream "$up" ${rls:+--rls "$rls"} --rls-timeout "$RLS_TIMEOUT"
  "$ENVOY" -c "$dir/envoy.yaml" --concurrency "$ENVOY_CONCURRENCY" --disable-hot-restart -l warn \
    --log-path "$dir/envoy.log" </dev/null >/dev/null 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$ADMIN/ready"
  wait_http "http://127.0.0.1:$LISTEN/"
}

# measure RUN CONNS REP: warm-up, counters reset, the measured wrk run, stats.
measure() {
  local run=$1 conns=$2 rep=$3 out threads
  out=$RAW/run-$1-c$2-r$3.txt
  threads=$(( conns < WRK_THREADS ? conns : WRK_THREADS ))
  local bound=$(( $(secs "$DURATION") + $(secs "$WARMUP") + 60 ))
  {
    echo "run=$run conns=$conns rep=$rep duration=$DURATION warmup=$WARMUP wrk_threads=$threads envoy_concurrency=$ENVOY_CONCURRENCY"
    flock -w 900 "$LOCK" timeout "$bound" bash -c '
      "$0" -t"$1" -c"$2" -d"$3" "http://127.0.0.1:$4/" >/dev/null
      curl -s -X POST "http://127.0.0.1:$5/reset_counters" >/dev/null
      "$0" -t"$1" -c"$2" -d"$6" --latency "http://127.0.0.1:$4/"
    ' "$WRK" "$threads" "$conns" "$WARMUP" "$LISTEN" "$ADMIN" "$DURATION"
    echo "--- envoy stats"
    curl -s -G "http://127.0.0.1:$ADMIN/stats" \
      --data-urlencode 'filter=(ratelimit|rate_limit|downstream_rq_[0-9]xx|upstream_rq_completed)'
    echo "--- upstream"
    curl -s "http://127.0.0.1:$UP_PORT/__counts" | grep '^total'
  } >"$out"
}

{
  echo "command: $0 (BUILD=$BUILD DURATION=$DURATION WARMUP=$WARMUP REPS=$REPS CONNS=\"$CONNS\" ROWS=\"$ROWS\" TG_WORKERS=\"$TG_WORKERS\" WRK_THREADS=$WRK_THREADS ENVOY_CONCURRENCY=$ENVOY_CONCURRENCY RLS_TIMEOUT=$RLS_TIMEOUT)"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- crates results/envoy || echo ' (with uncommitted changes)')"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "envoy: $("$ENVOY" --version 2>/dev/null | grep -o 'version: .*' || true)"
  echo "wrk: $("$WRK" -v 2>&1 | head -1 || true)"
  case " $ROWS " in *" d-"*|*" e-redis"*) echo "redis: $("$REDIS" --version)" ;; esac
  case " $ROWS " in
    *" e-"*) echo "limitador: $("$LIMITADOR" --version 2>/dev/null | head -1) ($(git -C "$(dirname "$LIMITADOR")/../.." rev-parse HEAD 2>/dev/null || echo '?'))" ;;
  esac
} >"$RAW/machine.txt"

start=$(date +%s)
for rep in $(seq "$REPS"); do
  n=${#RUNS[@]}
  for (( k=0; k<n; k++ )); do
    run=${RUNS[$(( (k + rep - 1) % n ))]}
    echo "round $rep/$REPS: $run" >&2
    start_stack "$run"
    for c in $CONNS; do measure "$run" "$c" "$rep"; done
    stop_all
  done
done

{
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "wall: $(( $(date +%s) - start )) s (measuring; the build before it not counted)"
} >>"$RAW/machine.txt"
status=0
{
  [ "$BUILD" = debug ] && echo "**BUILD=debug: a smoke run; these are not figures.**" && echo
  python3 $HERE/collect.py "$RAW"
} >"$OUT_TABLE" || status=$?
cat "$RAW/machine.txt" "$OUT_TABLE"
exit "$status"
