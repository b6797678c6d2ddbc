#!/usr/bin/env bash
# The Lua a group call runs (batch_many, issue 26's per-request path), counted bytecode by bytecode
# per source line, to see which lines of the library a change should shorten: lua_instructions.sh
# says what Redis spends in all (its interpreter costs about 40 machine instructions per bytecode
# and some 400 per Lua function call), this says where in the Lua.
#
#   crates/redis/benches/lua_lines.sh [SCENARIO] [GROUP] [TOP]
#
# Builds the library's batch part from the working tree's Lua files as crates/redis/src/function.rs
# builds it (the definitions of scripts.rs's batch_definitions!, then batch_many.lua), and runs
# lua_lines.lua on it in a Lua 5.1 (Redis's Lua version): GROUP requests of the fleet's three GCRA
# keys per call (default 32), SCENARIO `expired` (default) or `live` (see lua_lines.lua), the TOP
# lines (default 30). Redis is a table there: what each `redis.call` costs Redis is not counted.
# Needs lua5.1 (Debian's `lua5.1`; LUA= another binary of Lua 5.1).
set -euo pipefail

LUA=${LUA:-lua5.1}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$HERE/../src/lua
command -v "$LUA" >/dev/null || { echo "needs $LUA (apt-get install lua5.1, or LUA=...)" >&2; exit 2; }
library=$(mktemp)
trap 'rm -f "$library"' EXIT
{
  echo 'local KEYS, ARGV'
  cat "$SRC"/prelude.lua "$SRC"/tat.lua "$SRC"/fixed_window_decide.lua \
    "$SRC"/sliding_window_decide.lua "$SRC"/batch.lua "$SRC"/batch_many.lua
  echo 'return function(keys, args) KEYS, ARGV = keys, args; return batch_many() end'
} >"$library"
"$LUA" "$HERE/lua_lines.lua" "$library" "${1:-expired}" "${2:-32}" "${3:-30}"
