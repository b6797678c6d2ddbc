-- Fixed window: the key is a hash (i = window index, c = units admitted in it). Parameters: window_us,
-- limit, max_count (the largest count a valid state holds). Durations in µs.
local function fixed_window_decide(key, now, cost, window, limit, max_count)
  -- The decision on `key` at `now` for `cost` units. Reads only. Returns the reply {allowed,
  -- remaining, retry_after_us, reset_after_us} and the admission's write (nil: nothing to write).
  local h = hash_state(key, {'i', 'c'}, {idiv(LIMIT - 1, window), max_count})
  local si, sc = h[1], h[2]
  local ni = idiv(now, window)
  -- A later window starts from zero; a clock gone backwards keeps counting in the stored window.
  local index, count = si, sc
  if ni > si then
    index, count = ni, 0
  end
  local until_end = (index + 1) * window - now
  local used = count + cost
  if used > limit then
    return {0, 0, until_end, until_end}
  end
  local reset = until_end
  if used == 0 then
    reset = 0
  end
  local commit
  if cost > 0 then
    commit = function()
      redis.call('HSET', key, 'i', str(index), 'c', str(used))
      -- Fresh once the window ends.
      expire_in(key, until_end)
    end
  end
  return {1, limit - used, 0, reset}, commit
end
