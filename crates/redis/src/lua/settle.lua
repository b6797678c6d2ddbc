-- A reserved request's settlement: every key of the request brought from what it reserved to what
-- it cost, in one call. KEYS[1..n]: the keys (all on one node; one hash slot on Redis Cluster).
-- ARGV: now_us or '', then per key, in order, seven values: its algorithm ('g': GCRA and the leaky
-- bucket, 'f': fixed window, 's': sliding window), the operation ('r': give units back, 'c':
-- charge them), the units, a mark, and the algorithm's three parameters (as its single-key script
-- takes them).
-- * 'c': `*_charge` at now (the mark is unused).
-- * 'r' on 'g': the units given back are at most those of the reservation's segment still ahead of
--   now: the mark is the segment's end (the TAT the reservation wrote) in ns digits; units whose
--   time has passed are not handed out again. Then `gcra_refund` at now.
-- * 'r' on 'f' or 's': `*_refund` at the mark, the reservation's now in µs (the window it counted
--   the units in; nothing once that window's count has reset or aged out).
-- Each key is settled on its own: a key whose state cannot be read (another type, a value no
-- script wrote) is left untouched, and so are the others' outcomes. A key twice is refused before
-- any write.
-- Reply: per key, in order, 1 (written), 0 (nothing to do) or the error its state raised.
local CHARGE = {g = gcra_charge, f = fixed_window_charge, s = sliding_window_charge}
local REFUND = {f = fixed_window_refund, s = sliding_window_refund}
local function segment_left(raw, now, per_us)
  -- max(raw − now, 0) in units of 1000 / per_us ns, rounded down (a part of a unit is not given
  -- back), at most AHEAD_MAX. `raw`: a time in ns in plain digits.
  if type(raw) ~= 'string' or #raw > 19 or not string.find(raw, '^%d+$') then
    error({err = 'ERR segment end ' .. shown(raw) .. ' is not a time in ns in plain digits'})
  end
  local us, ns = 0, raw
  if #raw > 3 then
    us, ns = tonumber(string.sub(raw, 1, -4)), string.sub(raw, -3)
  end
  local d = us - now
  if d < 0 then
    return 0
  end
  return math.min(d * per_us + idiv(tonumber(ns), 1000 / per_us), AHEAD_MAX)
end
local function settle_one(key, now, code, op, units, mark, a, b, c)
  if op == 'c' then
    local charge = CHARGE[code]
    if charge == nil then
      error({err = 'ERR unknown algorithm ' .. shown(code)})
    end
    return charge(key, now, units, a, b, c)
  elseif op ~= 'r' then
    error({err = 'ERR unknown operation ' .. shown(op)})
  end
  if code == 'g' then
    local back = math.min(units, idiv(segment_left(mark, now, a), b))
    return gcra_refund(key, now, back, a, b, c)
  end
  local refund = REFUND[code]
  if refund == nil then
    error({err = 'ERR unknown algorithm ' .. shown(code)})
  end
  return refund(key, tonumber(mark), now, units, a, b, c)
end
local now = now_us()
local seen = {}
for i = 1, #KEYS do
  if seen[KEYS[i]] then
    error({err = 'TOLLGATE_KEY ' .. i .. ' ERR the key is in the request twice'})
  end
  seen[KEYS[i]] = true
end
local reply = {}
for i = 1, #KEYS do
  local at = 2 + (i - 1) * 7
  local ok, r = pcall(settle_one, KEYS[i], now, ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]),
    ARGV[at + 3], tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]), tonumber(ARGV[at + 6]))
  if ok then
    reply[i] = r
  else
    -- Redis 7 hands pcall the error's message; older versions the error table.
    if type(r) == 'table' then
      r = r.err
    end
    reply[i] = tostring(r)
  end
end
return reply
