-- Sliding window counter: the key is a hash (i = current window index, p = previous window's count,
-- c = current window's count, q = the quota it was written under). Parameters: window_us, limit, max_count (the largest count a valid
-- state holds). Durations in µs.
local function sliding_weighted(window, p, e)
  return cdiv(p * (window - e), window)
end
local function sliding_first_fit(window, p, room)
  if p == 0 then
    return 0
  end
  return window - math.min(idiv(room * window, p), window)
end
local function sliding_reset_after(window, p, c, e)
  if c > 0 then
    return window - e + window
  elseif p > 0 then
    return window - e
  end
  return 0
end
local function sliding_window_state(key, now, window, limit, max_count)
  -- The key's state {index, previous, current} under this quota, and the write (nil: none) that
  -- stores it when it was written under another quota: carried over as-is at `now` (the core's
  -- `Algorithm::carry_over`: min(the units it could take under its quota now, this limit), the rest
  -- counted as spent in now's window; a state fresh under its quota stays fresh). Reads only.
  local h, q = hash_read(key, {'i', 'p', 'c'})
  if not h then
    return 0, 0, 0
  end
  local tag = quota_tag(window, limit, max_count)
  if q == nil or q == tag then
    return uint(key, h[1], 'field i', idiv(LIMIT - 1, window)), uint(key, h[2], 'field p', max_count),
      uint(key, h[3], 'field c', max_count)
  end
  local ow, ol, om = tag_params(key, q)
  if ow < 1 or ow >= LIMIT / 2 then
    corrupt(key, 'quota ' .. shown(q) .. ' has no valid window')
  end
  local si = uint(key, h[1], 'field i', idiv(LIMIT - 1, ow))
  local sp, sc = uint(key, h[2], 'field p', om), uint(key, h[3], 'field c', om)
  local oi = idiv(now, ow)
  local prev, cur, elapsed
  if oi == si then
    prev, cur, elapsed = sp, sc, now - oi * ow
  elseif oi == si + 1 then
    prev, cur, elapsed = sc, 0, now - oi * ow
  elseif oi < si then
    -- Clock gone backwards: as its decision would, at the stored window's start.
    prev, cur, elapsed = sp, sc, 0
  else
    prev, cur, elapsed = 0, 0, 0
  end
  local spent = 0
  -- Fresh under its quota (every count aged out) stays fresh.
  if prev > 0 or cur > 0 then
    spent = spent_after(math.max(ol - cur - sliding_weighted(ow, prev, elapsed), 0), limit)
  end
  if spent == 0 then
    return 0, 0, 0, function()
      redis.call('DEL', key)
    end
  end
  local ni = idiv(now, window)
  return ni, 0, spent, function()
    redis.call('HSET', key, 'i', str(ni), 'p', '0', 'c', str(spent), 'q', tag)
    expire_in(key, (ni + 2) * window - now)
  end
end
local function sliding_window_decide(key, now, cost, window, limit, max_count)
  -- The decision on `key` at `now` for `cost` units. Reads only. Returns the reply {allowed,
  -- remaining, retry_after_us, reset_after_us}, the admission's write (nil: nothing to write), and
  -- the carry-over's write (nil: none; made when there is no admission to write).
  local si, sp, sc, carry = sliding_window_state(key, now, window, limit, max_count)
  local ni = idiv(now, window)
  local index, prev, cur, elapsed, lag
  if ni == si then
    index, prev, cur, elapsed, lag = ni, sp, sc, now - ni * window, 0
  elseif ni == si + 1 then
    index, prev, cur, elapsed, lag = ni, sc, 0, now - ni * window, 0
  elseif ni > si then
    index, prev, cur, elapsed, lag = ni, 0, 0, now - ni * window, 0
  else
    -- Clock gone backwards: decide at the stored window's start, add the lag to the waits.
    index, prev, cur, elapsed, lag = si, sp, sc, 0, si * window - now
  end
  local estimate = cur + sliding_weighted(window, prev, elapsed)
  if estimate + cost > limit then
    local wait
    if cur + cost <= limit then
      local fit = sliding_first_fit(window, prev, limit - cur - cost)
      if fit < window then
        wait = fit - elapsed
      end
    end
    if wait == nil then
      wait = window - elapsed + sliding_first_fit(window, cur, limit - cost)
    end
    return {0, 0, wait + lag, sliding_reset_after(window, prev, cur, elapsed) + lag}, nil, carry
  end
  cur = cur + cost
  local commit
  if cost > 0 then
    commit = function()
      redis.call('HSET', key, 'i', str(index), 'p', str(prev), 'c', str(cur), 'q', quota_tag(window, limit, max_count))
      -- Fresh once the current count has aged out of the previous window: end of window index + 1.
      expire_in(key, (index + 2) * window - now)
    end
  end
  return {1, limit - estimate - cost, 0, sliding_reset_after(window, prev, cur, elapsed) + lag}, commit, carry
end
