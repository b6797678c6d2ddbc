#!/usr/bin/env bash
# The redis-server's cost of one batch decision (issue 26), as instructions per call counted by
# valgrind's callgrind on a redis-server this script starts: load-independent, so it compares
# versions on a shared, noisy machine. Not a latency or throughput figure.
#
#   crates/redis/benches/lua_instructions.sh [REV ...]
#
# Each REV (a git revision; `worktree`, the default, is the working tree) is measured with the
# fleet's request (results/fleet: 3 GCRA keys per call, cost 1, the server's TIME; the keys and
# parameters tollgate-server sends there), in two scenarios: `expired` (the fleet's quotas,
# 1 000 000/s: every admission's TTL is 1 ms, so the keys are mostly gone or fresh when read
# again) and `live` (1000/s, 100 s of burst: each admission puts the TAT 1 ms further, so the keys
# are there when read, a state to parse and compare, then rewritten). Per REV the batch script by
# EVALSHA, and where the revision has the function library (crates/redis/src/function.rs), the
# same batch by FCALL. The scripts and the library are built from the REV's Lua files as
# crates/redis/src/scripts.rs and function.rs build them, with the arguments batch.rs sends (the
# cost and one plan where batch.lua reads a plan, else one spec per key where it reads specs, else
# five values per key).
#
# Where the REV has batch_many.lua, also GROUP requests (each as above) coalesced into one FCALL
# of batch_many, as coalesce.rs sends them: instructions per request (the call's / GROUP).
#
# And one lease call (lease.lua, the lease mode's: the first of the three keys, leases of up to 100
# units) by its script's EVALSHA (`lease-evalsha`) and, where the REV's library has the lease
# function, by FCALL (`lease-fcall`).
#
# Env: N (calls counted, default 2000, after 500 uncounted), SCENARIOS (default "expired live"),
# GROUP (default 32), GROUP_ONLY (1: only the group calls), REDIS_SERVER (default redis-server; a
# build with symbols names the interpreter's functions in callgrind's profile), KEEP (1: keep the
# callgrind files, in a directory the script names on stderr). Where in the Lua the group call's
# bytecodes go: lua_lines.sh.
# Needs redis-server, redis-cli, redis-benchmark, valgrind (callgrind_control), python3.
set -euo pipefail

N=${N:-2000}
GROUP=${GROUP:-32}
SCENARIOS=${SCENARIOS:-expired live}
ROOT=$(git rev-parse --show-toplevel)
GROUP_ONLY=${GROUP_ONLY:-0}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
WORK=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then
  echo "callgrind files in $WORK" >&2
else
  trap 'rm -rf "$WORK"' EXIT
fi

# The file at crates/redis/src/$2 in revision $1 (the working tree for `worktree`), or nothing.
source_file() {
  if [ "$1" = worktree ]; then
    cat "$ROOT/crates/redis/src/$2" 2>/dev/null || true
  else
    git -C "$ROOT" show "$1:crates/redis/src/$2" 2>/dev/null || true
  fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# measure LOAD_COMMAND... -- CALL...: instructions per call of CALL (redis-benchmark -c 1 -n N).
measure() {
  local load=() call=()
  while [ "$1" != -- ]; do load+=("$1"); shift; done
  shift
  call=("$@")
  local port dir pid
  port=$(free_port)
  dir=$(mktemp -d "$WORK/run.XXXX")
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" \
    "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --hz 1 \
    >/dev/null 2>"$dir/valgrind.log" &
  pid=$!
  for _ in $(seq 200); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  "${load[@]/#@PORT@/$port}" >/dev/null
  redis-benchmark -p "$port" -c 1 -n 500 -r 100 "${call[@]}" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  redis-benchmark -p "$port" -c 1 -n "$N" -r 100 "${call[@]}" >/dev/null
  callgrind_control -d "$pid" >/dev/null 2>&1
  local failed
  failed=$(redis-cli -p "$port" info commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_\(evalsha\|fcall\):.*failed_calls=\([0-9]*\).*/\2/p' |
    awk '{ s += $1 } END { print s + 0 }')
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$pid" 2>/dev/null || true
  if [ "${failed:-0}" != 0 ]; then
    echo "failed calls: $failed" >&2
    return 1
  fi
  local ir
  ir=$(sed -n 's/^summary: //p' "$dir"/cg.*.1)
  echo $((ir / N))
}

# The keys tollgate-server sends for results/fleet's three descriptors (as MONITOR shows them; the
# client address cycles over 100, here a random one of 100).
KEYS='tollgate:edge:per_ip:gcra:10.0.0.__rand_int__ tollgate:edge:per_ip_path:gcra:0800000031302e302e302e__rand_int__0a0000002f6170692f6974656d73 tollgate:edge:global:gcra:'

printf '%-12s %-13s %-8s %s\n' revision command scenario instructions/call
for rev in "${@:-worktree}"; do
  name=${rev//[^A-Za-z0-9]/_}
  definitions="$WORK/$name.definitions.lua"
  for f in prelude.lua tat.lua fixed_window_decide.lua sliding_window_decide.lua batch.lua; do
    source_file "$rev" "lua/$f"
  done >"$definitions"
  script="$WORK/$name.lua"
  { cat "$definitions"; source_file "$rev" lua/batch_eval.lua; } >"$script"
  sha=$(sha1sum "$script" | cut -c1-40)
  library=
  if [ -n "$(source_file "$rev" function.rs)" ]; then
    version=${sha:0:16}
    library="$WORK/$name.library.lua"
    {
      printf '#!lua name=tollgate_%s\nlocal KEYS, ARGV\n' "$version"
      cat "$definitions"
      printf "redis.register_function('tollgate_batch_%s', function(keys, args)\n" "$version"
      printf '  KEYS, ARGV = keys, args\n  return batch()\nend)\n'
      if [ -n "$(source_file "$rev" lua/batch_many.lua)" ]; then
        source_file "$rev" lua/batch_many.lua
        printf "redis.register_function('tollgate_batch_many_%s', function(keys, args)\n" "$version"
        printf '  KEYS, ARGV = keys, args\n  return batch_many()\nend)\n'
      fi
      if source_file "$rev" function.rs | grep -q 'tollgate_lease_'; then
        printf 'local function lease()\n'
        source_file "$rev" lua/lease.lua
        printf "\nend\nredis.register_function('tollgate_lease_%s', function(keys, args)\n" "$version"
        printf '  KEYS, ARGV = keys, args\n  HELD = nil\n  return lease()\nend)\n'
      fi
    } >"$library"
  fi
  for scenario in $SCENARIOS; do
    case $scenario in
      expired) params=('1,1,1000000' '1,1,1000000' '1,1,1000000') ;;
      live) params=('1,1000,100000000' '1,1000,100000000' '1,1000,100000000') ;;
      *) echo "unknown scenario $scenario" >&2; exit 2 ;;
    esac
    # The arguments after now_us (''), as the REV's batch.lua reads them: the cost and one plan
    # (peek and the keys' specs in one value); at 67732f7-f80c672 one plan with the cost in it;
    # before, cost, peek and one spec per key, and before that five values per key.
    args=()
    if source_file "$rev" lua/batch.lua | grep -q "ARGV\[3\]: the request's plan"; then
      plan="0"
      for p in "${params[@]}"; do plan+=" g1$p"; done
      args=(1 "$plan")
    elif source_file "$rev" lua/batch.lua | grep -q "the request's plan"; then
      plan="1 0"
      for p in "${params[@]}"; do plan+=" g1$p"; done
      args=("$plan")
    elif source_file "$rev" lua/batch.lua | grep -q 'one value, its spec'; then
      args=(1 0)
      for p in "${params[@]}"; do args+=("g1$p"); done
    else
      args=(1 0)
      for p in "${params[@]}"; do args+=(g 1 ${p//,/ }); done
    fi
    if [ "$GROUP_ONLY" != 1 ]; then
      # shellcheck disable=SC2086
      per_call=$(measure redis-cli -p @PORT@ -x script load -- \
        evalsha "$sha" 3 $KEYS "" "${args[@]}" <"$script")
      printf '%-12s %-13s %-8s %s\n' "$rev" evalsha "$scenario" "$per_call"
    fi
    if [ -n "$library" ]; then
      if [ "$GROUP_ONLY" != 1 ]; then
        # shellcheck disable=SC2086
        per_call=$(measure redis-cli -p @PORT@ -x function load replace -- \
          fcall "tollgate_batch_${sha:0:16}" 3 $KEYS "" "${args[@]}" <"$library")
        printf '%-12s %-13s %-8s %s\n' "$rev" fcall "$scenario" "$per_call"
      fi
      if grep -q "tollgate_batch_many_" "$library"; then
        # GROUP requests coalesced into one FCALL of batch_many (coalesce.rs), each with its own
        # three keys (random client addresses, the same global key) and arguments: per request.
        group_keys=() group_args=()
        for _ in $(seq "$GROUP"); do
          # shellcheck disable=SC2206
          group_keys+=($KEYS)
          # Per request: the cost and the plan; at 44014ff-41ccb08, now_us ('') before them.
          if source_file "$rev" lua/batch_many.lua | grep -q "pairs of cost and plan"; then
            group_args+=("${args[@]}")
          else
            group_args+=("" "${args[@]}")
          fi
        done
        per_call=$(measure redis-cli -p @PORT@ -x function load replace -- \
          fcall "tollgate_batch_many_${sha:0:16}" "${#group_keys[@]}" "${group_keys[@]}" \
          "${group_args[@]}" <"$library")
        printf '%-12s %-13s %-8s %s\n' "$rev" "group$GROUP" "$scenario" "$((per_call / GROUP))"
      fi
    fi
    [ "$GROUP_ONLY" = 1 ] && continue
    lease_key=${KEYS%% *}
    # shellcheck disable=SC2206
    lease_args=("" 1 100 ${params[0]//,/ })
    lease_script="$WORK/$name.lease.lua"
    for f in prelude.lua tat.lua lease.lua; do source_file "$rev" "lua/$f"; done >"$lease_script"
    lease_sha=$(sha1sum "$lease_script" | cut -c1-40)
    per_call=$(measure redis-cli -p @PORT@ -x script load -- \
      evalsha "$lease_sha" 1 "$lease_key" "${lease_args[@]}" <"$lease_script")
    printf '%-12s %-13s %-8s %s\n' "$rev" lease-evalsha "$scenario" "$per_call"
    if [ -n "$library" ] && grep -q "tollgate_lease_" "$library"; then
      per_call=$(measure redis-cli -p @PORT@ -x function load replace -- \
        fcall "tollgate_lease_${sha:0:16}" 1 "$lease_key" "${lease_args[@]}" <"$library")
      printf '%-12s %-13s %-8s %s\n' "$rev" lease-fcall "$scenario" "$per_call"
    fi
  done
done
