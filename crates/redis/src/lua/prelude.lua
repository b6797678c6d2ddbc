-- tollgate prelude: shared by every script.
-- Every number here is an integer below 2^53, so exact in a Lua double. Absolute times are whole
-- microseconds since the Unix epoch (the resolution of `TIME`); each script says in which unit it
-- computes durations. Replies are integers (Redis truncates Lua numbers to integers; ours are whole).
-- 2^53: the end of exact integers. A state that would reach it is refused (fails closed).
local LIMIT = 9007199254740992
local function idiv(a, b)
  -- floor(a / b) for a >= 0, b > 0, corrected for the rounding of the float quotient.
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
local function cdiv(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end
local function str(n)
  -- Integers as plain digits ("%.0f" is exact below 2^53; tostring could print an exponent).
  return string.format('%.0f', n)
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
local function hash_state(key, fields, max)
  -- The key's hash as integers, field i at most max[i]: all 0 for an absent key; exactly `fields`,
  -- each present, or it is corrupt (a foreign hash). HLEN on another type raises WRONGTYPE.
  local n = redis.call('HLEN', key)
  local out = {}
  if n == 0 then
    for i = 1, #fields do
      out[i] = 0
    end
    return out
  end
  if n ~= #fields then
    corrupt(key, 'a hash of ' .. n .. ' fields, this limiter stores exactly ' .. table.concat(fields, ', '))
  end
  local h = redis.call('HMGET', key, unpack(fields))
  for i = 1, #fields do
    out[i] = uint(key, h[i], 'field ' .. fields[i], max[i])
  end
  return out
end
local function now_us()
  if ARGV[1] ~= '' then
    return tonumber(ARGV[1])
  end
  -- Server time. Redis >= 5 replicates scripts by effects (the only mode since 7), so TIME is
  -- allowed before writes; on 3.2-4.x replicate_commands switches that mode on.
  if redis.replicate_commands then
    pcall(redis.replicate_commands)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
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
  local reply, commit = decide(key, now, cost, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
  if commit and not peek then
    commit()
  end
  return reply
end
local function expire_in(key, us)
  -- Keep the key `us` microseconds more, rounded up to whole milliseconds (never expires early).
  redis.call('PEXPIRE', key, str(math.max(cdiv(us, 1000), 1)))
end
