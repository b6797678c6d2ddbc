-- The sliding window counter's settlement functions (see sliding_window_decide.lua): a refund and a
-- charge, shared by their single-key scripts and the settle script. Each returns 1 when it wrote
-- (or deleted) the key, 0 when it left it untouched, and raises before any write on a state it
-- cannot read.
local function sliding_window_refund(key, at, now, cost, window, limit, max_count)
  -- Gives back `cost` units admitted at `at`, as the core's `SlidingWindow::refund` at `at`: off
  -- the current count while the stored window is at's, off the previous count when a later
  -- admission moved the stored window one on, saturating; nothing otherwise (the count has aged
  -- out, or the stored window is older). A state written under another quota is carried over at
  -- `now` first. The TTL runs from `now` (the refund scripts pass at = now).
  local si, sp, sc, carry = sliding_window_state(key, now, window, limit, max_count)
  local ai = idiv(at, window)
  local function nothing()
    if carry then
      carry()
      return 1
    end
    return 0
  end
  if cost <= 0 then
    return nothing()
  end
  if si == ai and sc > 0 then
    sc = math.max(sc - cost, 0)
  elseif si == ai + 1 and sp > 0 then
    sp = math.max(sp - cost, 0)
  else
    return nothing()
  end
  if sp == 0 and sc == 0 then
    -- Both counts zero: the fresh state, the absent key.
    redis.call('DEL', key)
    return 1
  end
  redis.call('HSET', key, 'i', str(si), 'p', str(sp), 'c', str(sc), 'q', quota_tag(window, limit, max_count))
  -- Fresh once the last non-zero count has aged out: the current one at the end of window si + 1,
  -- the previous one at the end of window si.
  if sc > 0 then
    expire_in(key, (si + 2) * window - now)
  else
    expire_in(key, (si + 1) * window - now)
  end
  return 1
end
local function sliding_window_charge(key, now, cost, window, limit, max_count)
  -- Counts `cost` units at `now` without a decision, as the core's `SlidingWindow::charge`: into
  -- now's window (moving the state on as a decision would; a clock gone backwards keeps counting in
  -- the stored window), beyond the limit if need be, the count capped at max_count (at least the
  -- limit). A state written under another quota is carried over first; the charge writes this
  -- quota's tag.
  local si, sp, sc, carry = sliding_window_state(key, now, window, limit, max_count)
  if cost <= 0 then
    if carry then
      carry()
      return 1
    end
    return 0
  end
  local ni = idiv(now, window)
  local index, prev, cur = si, sp, sc
  if ni == si + 1 then
    index, prev, cur = ni, sc, 0
  elseif ni > si + 1 then
    index, prev, cur = ni, 0, 0
  end
  cur = math.min(cur + cost, max_count)
  redis.call('HSET', key, 'i', str(index), 'p', str(prev), 'c', str(cur), 'q', quota_tag(window, limit, max_count))
  -- Fresh once the current count has aged out of the previous window: end of window index + 1.
  expire_in(key, (index + 2) * window - now)
  return 1
end
