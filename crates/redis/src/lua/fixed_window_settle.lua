-- The fixed window's settlement functions (see fixed_window_decide.lua): a refund and a charge,
-- shared by their single-key scripts and the settle script. Each returns 1 when it wrote (or
-- deleted) the key, 0 when it left it untouched, and raises before any write on a state it cannot
-- read.
local function fixed_window_refund(key, at, now, cost, window, limit, max_count)
  -- Gives back `cost` units admitted at `at`, as the core's `FixedWindow::refund` at `at`: off the
  -- count when the stored window is at's window (where the admission counted it), saturating;
  -- nothing when the window has rolled (the count it was in has already reset) or the stored
  -- window is later (a clock gone backwards: ambiguous, so stricter). A state written under
  -- another quota is carried over at `now` first. The TTL runs from `now` (the refund scripts pass
  -- at = now).
  local si, sc, carry = fixed_window_state(key, now, window, limit, max_count)
  if cost <= 0 or sc == 0 or si ~= idiv(at, window) then
    if carry then
      carry()
      return 1
    end
    return 0
  end
  if cost >= sc then
    -- A count of zero is the fresh state: the absent key.
    redis.call('DEL', key)
    return 1
  end
  redis.call('HSET', key, 'i', str(si), 'c', str(sc - cost), 'q', quota_tag(window, limit, max_count))
  -- Still fresh once the window ends.
  expire_in(key, (si + 1) * window - now)
  return 1
end
local function fixed_window_charge(key, now, cost, window, limit, max_count)
  -- Counts `cost` units at `now` without a decision, as the core's `FixedWindow::charge`: into now's
  -- window (a later window starts from zero; a clock gone backwards keeps counting in the stored
  -- one), beyond the limit if need be, the count capped at max_count (at least the limit, so a
  -- capped count still denies everything in its window). A state written under another quota is
  -- carried over first; the charge writes this quota's tag.
  local si, sc, carry = fixed_window_state(key, now, window, limit, max_count)
  if cost <= 0 then
    if carry then
      carry()
      return 1
    end
    return 0
  end
  local ni = idiv(now, window)
  local index, count = si, sc
  if ni > si then
    index, count = ni, 0
  end
  -- count + cost is exact up to 2^53; beyond, it is a double far above max_count (< 2^52).
  count = math.min(count + cost, max_count)
  redis.call('HSET', key, 'i', str(index), 'c', str(count), 'q', quota_tag(window, limit, max_count))
  -- Fresh once the window ends.
  expire_in(key, (index + 1) * window - now)
  return 1
end
