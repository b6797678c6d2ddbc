-- GCRA's (and the leaky bucket's) settlement functions on a TAT key (see tat.lua): a refund and a
-- charge, shared by their single-key scripts and the settle script. Each returns 1 when it wrote
-- (or deleted) the key, 0 when it left it untouched, and raises before any write on a state it
-- cannot read.
local function gcra_refund(key, now, cost, per_us, interval, depth)
  -- Gives back `cost` units admitted earlier, as the core's `Gcra::refund` does: the TAT moves back
  -- by cost × interval, never below now (a TAT at or before now is a full bucket, so that is the
  -- core's `TAT − cost × T` as every later decision sees it). A state written under another quota is
  -- carried over first (see tat_read).
  local ahead, carried = tat_read(key, now, per_us, interval, depth)
  if cost <= 0 or ahead == 0 then
    -- Nothing to give back: the bucket is already full at now (a TAT in the past is not rewritten).
    if carried then
      tat_write(key, now, ahead, per_us, interval, depth)
      return 1
    end
    return 0
  end
  -- cost < cdiv(ahead, interval) <= 2^52 / interval keeps cost × interval below ahead: exact. A
  -- larger cost (any u64, as a double) empties the TAT to now: the fresh state, the absent key.
  if cost >= cdiv(ahead, interval) then
    redis.call('DEL', key)
    return 1
  end
  -- Fresh again at the new TAT: the key lives that long.
  set_tat(key, now, ahead - cost * interval, per_us, interval, depth)
  return 1
end
local function gcra_charge(key, now, cost, per_us, interval, depth)
  -- Counts `cost` units at `now` without a decision, as the core's `Gcra::charge` does: the TAT
  -- moves to max(TAT, now) + cost × interval, past the depth if need be (debt: the next unit fits
  -- once the TAT is back within the depth). The TAT stays at most AHEAD_MAX units (2^52) ahead of
  -- now, the furthest a stored TAT may be (the core saturates at the end of its clock's range): a
  -- larger debt stops there, which still denies every request for that long. A state written under
  -- another quota is carried over first (see tat_read); the charge writes this quota's tag.
  local ahead, carried = tat_read(key, now, per_us, interval, depth)
  if cost <= 0 then
    if carried then
      tat_write(key, now, ahead, per_us, interval, depth)
      return 1
    end
    return 0
  end
  local new_ahead = AHEAD_MAX
  -- cost <= (AHEAD_MAX − ahead) / interval keeps the sum exact and at most AHEAD_MAX; a larger cost
  -- (any u64, as a double) stops at AHEAD_MAX.
  if cost <= idiv(AHEAD_MAX - ahead, interval) then
    new_ahead = ahead + cost * interval
  end
  set_tat(key, now, new_ahead, per_us, interval, depth)
  return 1
end
