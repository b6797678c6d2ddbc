-- Fixed window: the key is a hash (i = window index, c = units admitted in it, q = the quota it was
-- written under). Parameters: window_us, limit, max_count (the largest count a valid state holds).
-- Durations in µs.
local function fixed_window_state(key, now, window, limit, max_count)
  -- The key's state {index, count} under this quota, and the write (nil: none) that stores it when
  -- it was written under another quota: carried over as-is at `now` (the core's
  -- `Algorithm::carry_over`: min(the units it could take under its quota now, this limit), the rest
  -- counted as spent in now's window; a state fresh under its quota stays fresh). Reads only.
  local h, q = hash_read(key, {'i', 'c'})
  if not h then
    return 0, 0
  end
  local tag = quota_tag(window, limit, max_count)
  if q == nil or q == tag then
    return uint(key, h[1], 'field i', idiv(LIMIT - 1, window)), uint(key, h[2], 'field c', max_count)
  end
  local ow, ol, om = tag_params(key, q)
  if ow < 1 or ow >= LIMIT / 2 then
    corrupt(key, 'quota ' .. shown(q) .. ' has no valid window')
  end
  local si, sc = uint(key, h[1], 'field i', idiv(LIMIT - 1, ow)), uint(key, h[2], 'field c', om)
  local spent = 0
  -- Fresh under its quota: nothing counted, or its window is over. Otherwise (a clock gone
  -- backwards included) it counts in the stored window, as its decision would.
  if sc > 0 and idiv(now, ow) <= si then
    spent = spent_after(math.max(ol - sc, 0), limit)
  end
  if spent == 0 then
    return 0, 0, function()
      redis.call('DEL', key)
    end
  end
  local ni = idiv(now, window)
  return ni, spent, function()
    redis.call('HSET', key, 'i', str(ni), 'c', str(spent), 'q', tag)
    expire_in(key, (ni + 1) * window - now)
  end
end
local function fixed_window_decide(key, now, cost, window, limit, max_count)
  -- The decision on `key` at `now` for `cost` units. Reads only. Returns the reply {allowed,
  -- remaining, retry_after_us, reset_after_us}, the admission's write (nil: nothing to write), and
  -- the carry-over's write (nil: none; made when there is no admission to write).
  local si, sc, carry = fixed_window_state(key, now, window, limit, max_count)
  local ni = idiv(now, window)
  -- A later window starts from zero; a clock gone backwards keeps counting in the stored window.
  local index, count = si, sc
  if ni > si then
    index, count = ni, 0
  end
  local until_end = (index + 1) * window - now
  local used = count + cost
  if used > limit then
    return {0, 0, until_end, until_end}, nil, carry
  end
  local reset = until_end
  if used == 0 then
    reset = 0
  end
  local commit
  if cost > 0 then
    commit = function()
      redis.call('HSET', key, 'i', str(index), 'c', str(used), 'q', quota_tag(window, limit, max_count))
      -- Fresh once the window ends.
      expire_in(key, until_end)
    end
  end
  return {1, limit - used, 0, reset}, commit, carry
end
