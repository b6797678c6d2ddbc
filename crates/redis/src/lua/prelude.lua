-- tollgate prelude: shared by every script.
-- Every number here is an integer below 2^53, so exact in a Lua double. Absolute times are whole
-- microseconds since the Unix epoch (the resolution of `TIME`); each script says in which unit it
-- computes durations. Replies are integers (Redis truncates Lua numbers to integers; ours are whole).
-- 2^53: the end of exact integers. A state that would reach it is refused (fails closed).
local LIMIT = 9007199254740992
-- The standard functions the hot paths call, as upvalues (cheaper than a global and a field each
-- time), and the formats of integers as plain digits (tostring could print an exponent). All set by
-- `init` on a script's first call of now_us (a function library cannot use `string` or `math`
-- while it loads). INT: '%d' where Lua's integer cast (a C long) is exact up to 2^53 (every 64-bit
-- build; about half the cost of '%.0f'), else '%.0f' (exact below 2^53). INT3: a quota tag (see
-- quota_tag).
local floor, format, find, sub, match, tonum
local INT, INT3
local function init()
  floor, format, find, sub, match = math.floor, string.format, string.find, string.sub, string.match
  tonum = tonumber
  INT = '%.0f'
  if format('%d', LIMIT) == '9007199254740992' then
    INT = '%d'
  end
  INT3 = INT .. ',' .. INT .. ',' .. INT
end
local function idiv(a, b)
  -- floor(a / b) for a >= 0, b > 0, corrected for the rounding of the float quotient.
  if b == 1 then
    return a
  end
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
local function cdiv(a, b)
  -- ceil(a / b) for a >= 0, b > 0. A unit divisor is answered here rather than by a call of idiv:
  -- a Lua call costs Redis's interpreter about 400 instructions, and this runs per key.
  if b == 1 then
    return a
  end
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end
local function str(n)
  return format(INT, n)
end
-- Memos: what a function library computes again and again with the same inputs, kept across calls
-- (an EVAL script starts with them empty): numbers parsed from their arguments (the parameters and
-- costs the client sends) and the digits of small integers (TTLs). Each holds at most MEMO_MAX
-- entries, then starts again empty; what they hold is a pure function of the key, so a call's
-- answer never depends on them.
local MEMO_MAX = 4096
local NUMS, NUMS_N, DIGITS, DIGITS_N = {}, 0, {}, 0
local function num(s)
  -- tonumber(s), memoized (s: a string).
  local n = NUMS[s]
  if n == nil then
    n = tonum(s)
    if n ~= nil then
      if NUMS_N >= MEMO_MAX then
        NUMS, NUMS_N = {}, 0
      end
      NUMS[s], NUMS_N = n, NUMS_N + 1
    end
  end
  return n
end
local function digits(n)
  -- str(n), memoized: for integers that recur (TTLs in ms).
  local s = DIGITS[n]
  if s == nil then
    s = format(INT, n)
    if DIGITS_N >= MEMO_MAX then
      DIGITS, DIGITS_N = {}, 0
    end
    DIGITS[n], DIGITS_N = s, DIGITS_N + 1
  end
  return s
end
local function corrupt(key, what)
  -- Stored state under `key` this script cannot have written: an error, never a decision (the client
  -- maps the TOLLGATE_CORRUPT code to its typed error). Called before any write, so nothing is written.
  error({err = 'TOLLGATE_CORRUPT ' .. key .. ': ' .. what})
end
local function shown(raw)
  -- A stored value for an error message: at most 40 bytes, quoted.
  return string.format('%q', string.sub(tostring(raw), 1, 40))
end
local function uint(key, raw, what, max)
  -- A stored integer in plain digits, at most `max` (< 2^53); anything else is corrupt.
  if type(raw) ~= 'string' or #raw > 16 or not string.find(raw, '^%d+$') then
    corrupt(key, what .. ' ' .. shown(raw) .. ' is not an integer in plain digits below 2^53')
  end
  local n = tonumber(raw)
  if n > max then
    corrupt(key, what .. ' ' .. raw .. ' is out of range (at most ' .. str(max) .. ')')
  end
  return n
end
local function quota_tag(a, b, c)
  -- The quota a state is written under: its algorithm's three parameters, stored with the state, so
  -- that a script running under another quota (a reload, an override) knows how to read it.
  return format(INT3, a, b, c)
end
local function tag_params(key, tag)
  -- The three parameters a stored quota tag names (each an integer below 2^53), or it is corrupt.
  local a, b, c = string.match(tag, '^(%d+),(%d+),(%d+)$')
  if not a then
    corrupt(key, 'quota ' .. shown(tag) .. ' is not three integers')
  end
  return uint(key, a, 'quota', LIMIT - 1), uint(key, b, 'quota', LIMIT - 1), uint(key, c, 'quota', LIMIT - 1)
end
local function hash_read(key, fields)
  -- A window state's hash: nil for an absent key; else the raw values of `fields` and the quota tag
  -- 'q' (nil: written before states carried their quota, read under the caller's). Exactly `fields`,
  -- with or without 'q', or it is corrupt (a foreign hash). HLEN on another type raises WRONGTYPE.
  local n = redis.call('HLEN', key)
  if n == 0 then
    return nil
  end
  if n ~= #fields and n ~= #fields + 1 then
    corrupt(key, 'a hash of ' .. n .. ' fields, this limiter stores exactly ' .. table.concat(fields, ', ') .. ', q')
  end
  local h = redis.call('HMGET', key, 'q', unpack(fields))
  local q = h[1]
  if not q then
    if n ~= #fields then
      corrupt(key, 'a hash of ' .. n .. ' fields without q, this limiter stores exactly ' .. table.concat(fields, ', ') .. ', q')
    end
    q = nil
  end
  table.remove(h, 1)
  return h, q
end
local function spent_after(avail, capacity)
  -- As-is carry-over: the units a state written under another quota keeps are min(what it could take
  -- under that quota now, this quota's capacity); the rest of this capacity counts as spent now.
  return capacity - math.min(avail, capacity)
end
local function server_us()
  -- Server time. Redis >= 5 replicates scripts by effects (the only mode since 7), so TIME is
  -- allowed before writes; on 3.2-4.x replicate_commands switches that mode on.
  if redis.replicate_commands then
    pcall(redis.replicate_commands)
  end
  local t = redis.call('TIME')
  -- The seconds recur (a second's calls): memoized.
  return num(t[1]) * 1000000 + tonum(t[2])
end
local function now_us()
  if not INT then
    init()
  end
  if ARGV[1] ~= '' then
    return tonum(ARGV[1])
  end
  return server_us()
end
local function decision_args()
  -- The decision scripts' first arguments: KEYS[1] the key; ARGV now_us or '', cost, peek (0/1).
  -- The algorithm's parameters follow from ARGV[4].
  return KEYS[1], now_us(), tonumber(ARGV[2]), ARGV[3] == '1'
end
local function decide_one(decide)
  -- A single-key decision script: `decide` (one of the algorithms' `*_decide` functions) on KEYS[1]
  -- with the parameters ARGV[4..6]; its write, if any, unless this is a peek.
  local key, now, cost, peek = decision_args()
  local reply, commit, carry = decide(key, now, cost, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
  if not peek then
    -- The admission's write, or else the carry-over of a state written under another quota (stored
    -- even by a denial, so that the key does not go on refilling under the quota it left).
    if commit then
      commit()
    elseif carry then
      carry()
    end
  end
  return reply
end
local function expire_in(key, us)
  -- Keep the key `us` microseconds more, rounded up to whole milliseconds (never expires early).
  redis.call('PEXPIRE', key, str(math.max(cdiv(us, 1000), 1)))
end
