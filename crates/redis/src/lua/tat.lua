-- GCRA's stored state: the theoretical arrival time (TAT) in nanoseconds since the Unix epoch, as
-- plain digits (the core's state word itself), then ';' and the quota it was written under (units per
-- µs, interval, depth: see quota_tag; a value without it was written before states carried their
-- quota and is read under the caller's). It is too large for a double, so it is read
-- as whole µs (all digits but the last three) and a nanosecond part, and the scripts compute relative
-- to `now` in a unit of 1000 / per_us nanoseconds, a divisor of 1000 that also divides the emission
-- interval (chosen by the client, see `RedisEncoding for Gcra`): every value then stays an exact
-- integer, and the script's arithmetic is the core's, term for term.
-- The furthest ahead of now a stored TAT may be: 2^52 units (so that adding a cost, at most the depth
-- < 2^51 units, stays exact).
local AHEAD_MAX = 4503599627370496
local function tat_parse(key, raw)
  -- A stored TAT's digits as whole µs (all digits but the last three) and the nanosecond part (the
  -- last three), or it is corrupt.
  if #raw > 19 or not find(raw, '^%d+$') then
    corrupt(key, 'TAT ' .. shown(raw) .. ' is not a time in ns in plain digits')
  end
  if #raw <= 3 then
    return 0, tonum(raw)
  end
  local us = tonum(sub(raw, 1, -4))
  if us >= LIMIT then
    corrupt(key, 'TAT ' .. raw .. ' is past 2^53 us')
  end
  return us, tonum(sub(raw, -3))
end
local function tat_ahead(key, us, ns, now, per_us)
  -- max(TAT - now, 0) in units, the TAT being `us` µs and `ns` ns (tat_parse).
  local d = us - now
  if d < 0 then
    -- TAT - now = d × 1000 + ns <= -1000 + 999 < 0.
    return 0
  end
  -- A TAT between two units (never written by the core for this quota) reads as the later one.
  local ahead
  if per_us == 1 then
    ahead = d
    if ns > 0 then
      ahead = d + 1
    end
  else
    ahead = d * per_us + cdiv(ns, 1000 / per_us)
  end
  if ahead > AHEAD_MAX then
    -- Writes put the TAT at most a depth (< 2^51 units) ahead; this is not a clock gone backwards.
    corrupt(key, 'TAT ' .. str(us) .. format('%03d', ns) .. ' is more than 2^52 units of ' .. str(1000 / per_us) .. ' ns ahead of now')
  end
  return ahead
end
-- Within a call of batch_many that holds its GCRA states (batch_many.lua; nil otherwise, where reads
-- and writes go straight to Redis): HELD, each key's state as its requests have read or written it
-- so far: the stored value as read (false: none), or once a request has written it, its TAT's whole
-- µs (a number), with its nanosecond part in HELD_NS and its quota tag in HELD_TAG (false when
-- deleted). HELD_TTL holds the write each written key gets once, when the call ends (tat_flush): its
-- TTL in ms, 0 for a delete. A key that several requests touch (a global limit) is then read once,
-- parsed once and written once; Redis's clock does not move within a call, so the writes are those
-- of the last request, as if each had been made at once.
local HELD, HELD_NS, HELD_TAG, HELD_TTL
-- The digits of the last whole-µs TAT written, and that TAT: the keys a call admits with one quota
-- and the same state share their new TAT.
local last_us, last_digits = -1, ''
local function tat_value(us, ns, tag)
  -- The stored value of a TAT of `us` µs and `ns` ns under the quota `tag`: nanosecond digits, ';'
  -- and the tag.
  if us ~= last_us then
    last_us, last_digits = us, str(us)
  end
  if ns == 0 then
    return last_digits .. '000;' .. tag
  end
  return last_digits .. format('%03d', ns) .. ';' .. tag
end
local function tat_flush()
  -- The held writes, one per key (see HELD).
  local held = HELD
  for key, ms in pairs(HELD_TTL) do
    if ms == 0 then
      redis.call('DEL', key)
    else
      redis.call('PSETEX', key, digits(ms), tat_value(held[key], HELD_NS[key], HELD_TAG[key]))
    end
  end
end
local function tat_read(key, now, per_us, interval, depth, tag)
  -- The key's max(TAT - now, 0) in this quota's units, and whether it must be written (tat_write)
  -- because it was written under another quota: carried over as-is at `now` (the core's
  -- `Algorithm::carry_over`: min(the units it could take under its quota now, this burst), the rest
  -- counted as spent now; a TAT at or before now, fresh under any quota, stays fresh). Reads only.
  -- `tag`: this quota's tag (quota_tag), if the caller has it.
  -- The key's state (see HELD), from HELD when held.
  local held, raw = HELD, nil
  if held then
    raw = held[key]
    if raw == nil then
      raw = redis.call('GET', key)
      held[key] = raw
    end
  else
    raw = redis.call('GET', key)
  end
  if not raw then
    return 0
  end
  local us, ns, q
  if type(raw) == 'number' then
    us, ns, q = raw, HELD_NS[key], HELD_TAG[key]
  else
    local at = find(raw, ';', 1, true)
    if not at then
      us, ns = tat_parse(key, raw)
      return tat_ahead(key, us, ns, now, per_us)
    end
    q = sub(raw, at + 1)
    us, ns = tat_parse(key, sub(raw, 1, at - 1))
  end
  if q == (tag or quota_tag(per_us, interval, depth)) then
    return tat_ahead(key, us, ns, now, per_us)
  end
  local op, oi, od = tag_params(key, q)
  if op < 1 or op > 1000 or 1000 % op ~= 0 or oi < 1 then
    corrupt(key, 'quota ' .. shown(q) .. ' is not a GCRA quota')
  end
  local ahead = 0
  local old = tat_ahead(key, us, ns, now, op)
  if old > 0 then
    local avail = 0
    if od > old then
      avail = idiv(od - old, oi)
    end
    ahead = spent_after(avail, idiv(depth, interval)) * interval
  end
  return ahead, true
end
local function gcra_args()
  -- ARGV[4..6]: units per µs, the emission interval and the bucket depth in units.
  return tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
end
local function set_tat(key, now, ahead, per_us, interval, depth, tag)
  -- The value: now + ahead units as a TAT (tat_value) under this quota (`tag`, if the caller has
  -- it). The TTL ends where the state turns fresh (the TAT), rounded up to whole ms: 1 ms = per_us
  -- × 1000 units.
  local us, ns = now + ahead, 0
  if per_us ~= 1 then
    local whole = idiv(ahead, per_us)
    us, ns = now + whole, (ahead - whole * per_us) * (1000 / per_us)
  end
  local ms = cdiv(ahead, per_us * 1000)
  if ms < 1 then
    ms = 1
  end
  tag = tag or quota_tag(per_us, interval, depth)
  if HELD then
    HELD[key], HELD_NS[key], HELD_TAG[key], HELD_TTL[key] = us, ns, tag, ms
    return
  end
  -- PSETEX: SET with PX in one argument fewer (about 600 instructions less for Redis).
  redis.call('PSETEX', key, digits(ms), tat_value(us, ns, tag))
end
local function tat_write(key, now, ahead, per_us, interval, depth, tag)
  -- Stores `ahead` units past now (set_tat), or deletes the key for 0 (the fresh state).
  if ahead == 0 then
    if HELD then
      HELD[key], HELD_TTL[key] = false, 0
      return
    end
    redis.call('DEL', key)
  else
    set_tat(key, now, ahead, per_us, interval, depth, tag)
  end
end
local function gcra_decide(key, now, cost, per_us, interval, depth, tag)
  -- GCRA (and the leaky bucket) on `key` at `now` for `cost` units; parameters as gcra_args. Reads
  -- only. Returns the reply's four values (allowed, remaining, retry_after, reset_after in units,
  -- -1 = never), then what to write as data, not closures (cheaper for a call that makes several):
  -- the admission's ahead (nil when there is nothing to write) and the carry-over's ahead (nil: none;
  -- written when there is no admission to write), each written by tat_write. `tag`: this quota's
  -- tag (quota_tag), if the caller has it.
  -- ahead = max(tat, now) - now; new_ahead = new_tat - now.
  local ahead, carried = tat_read(key, now, per_us, interval, depth, tag)
  local carry
  if carried then
    carry = ahead
  end
  local new_ahead = ahead + cost * interval
  -- (A unit of 1 µs, an interval of whole µs, needs no division: cdiv is a Lua call.)
  if now + (per_us == 1 and new_ahead or cdiv(new_ahead, per_us)) >= LIMIT then
    return 0, 0, -1, -1, nil, carry
  end
  -- allow_at = new_tat - depth; denied while now < allow_at.
  local wait = new_ahead - depth
  if wait > 0 then
    return 0, 0, wait, ahead, nil, carry
  end
  if cost > 0 then
    -- Fresh again once the TAT is reached: the key lives exactly that long.
    return 1, idiv(depth - new_ahead, interval), 0, new_ahead, new_ahead, carry
  end
  return 1, idiv(depth - new_ahead, interval), 0, new_ahead, nil, carry
end
