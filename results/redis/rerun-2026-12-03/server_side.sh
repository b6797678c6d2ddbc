#!/usr/bin/env bash
# Server-side CPU per script call (INFO commandstats usec_per_call for EVALSHA), before vs after,
# on one local redis-server. BASE: a checkout of the commit before (git archive aae96b1 | tar -x -C $BASE).
set -euo pipefail
BASE=${BASE:-/tmp/tg-base}; P=${PORT:-6398}
B=$BASE/crates/redis/src/lua; A=$(git rev-parse --show-toplevel)/crates/redis/src/lua
redis-server --port $P --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & SERVER=$!
trap 'kill $SERVER' EXIT; sleep 0.5
load() { redis-cli -p $P SCRIPT LOAD "$(cat "$@")"; }
gcra_b=$(load $B/prelude.lua $B/gcra.lua); gcra_a=$(load $A/prelude.lua $A/tat.lua $A/gcra.lua)
fw_b=$(load $B/prelude.lua $B/fixed_window.lua); fw_a=$(load $A/prelude.lua $A/fixed_window.lua)
sw_b=$(load $B/prelude.lua $B/sliding_window.lua); sw_a=$(load $A/prelude.lua $A/sliding_window.lua)
run() { local sha=$1; shift; redis-cli -p $P CONFIG RESETSTAT >/dev/null
  redis-benchmark -p $P -n 100000 -c 8 -r 10000 -q EVALSHA $sha 1 "k$sha:__rand_int__" "" 1 0 "$@" >/dev/null 2>&1
  redis-cli -p $P INFO commandstats | grep cmdstat_evalsha | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/'; }
echo "rep gcra_before gcra_after fixed_before fixed_after sliding_before sliding_after (us per call)"
for rep in 1 2 3 4 5; do
  echo "$rep $(run $gcra_b 1 100000000) $(run $gcra_a 1 1 100000000) $(run $fw_b 1000000 100000) $(run $fw_a 1000000 100000 536870911) $(run $sw_b 1000000 10000) $(run $sw_a 1000000 10000 16383)"
done
