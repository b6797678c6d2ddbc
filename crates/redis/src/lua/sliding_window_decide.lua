-- Sliding window counter: the key is a hash (i = current window index, p = previous window's count,
-- c = current window's count). Parameters: window_us, limit, max_count (the largest count a valid
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
local function sliding_window_decide(key, now, cost, window, limit, max_count)
  -- The decision on `key` at `now` for `cost` units. Reads only. Returns the reply {allowed,
  -- remaining, retry_after_us, reset_after_us} and the admission's write (nil: nothing to write).
  local h = hash_state(key, {'i', 'p', 'c'}, {idiv(LIMIT - 1, window), max_count, max_count})
  local si, sp, sc = h[1], h[2], h[3]
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
    return {0, 0, wait + lag, sliding_reset_after(window, prev, cur, elapsed) + lag}
  end
  cur = cur + cost
  local commit
  if cost > 0 then
    commit = function()
      redis.call('HSET', key, 'i', str(index), 'p', str(prev), 'c', str(cur))
      -- Fresh once the current count has aged out of the previous window: end of window index + 1.
      expire_in(key, (index + 2) * window - now)
    end
  end
  return {1, limit - estimate - cost, 0, sliding_reset_after(window, prev, cur, elapsed) + lag}, commit
end
