-- Sliding window counter. KEYS[1]: the key (hash: i = current window index, p = previous window's
-- count, c = current window's count). ARGV: now_us or '', cost, peek (0/1), window_us, limit,
-- max_count (the largest count a valid state holds).
-- Reply: {allowed, remaining, retry_after_us, reset_after_us}.
local key, now, cost, peek = decision_args()
local window, limit, max_count = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
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
local function weighted(p, e)
  return cdiv(p * (window - e), window)
end
local function first_fit(p, room)
  if p == 0 then
    return 0
  end
  return window - math.min(idiv(room * window, p), window)
end
local function reset_after(p, c, e)
  if c > 0 then
    return window - e + window
  elseif p > 0 then
    return window - e
  end
  return 0
end
local estimate = cur + weighted(prev, elapsed)
if estimate + cost > limit then
  local wait
  if cur + cost <= limit then
    local fit = first_fit(prev, limit - cur - cost)
    if fit < window then
      wait = fit - elapsed
    end
  end
  if wait == nil then
    wait = window - elapsed + first_fit(cur, limit - cost)
  end
  return {0, 0, wait + lag, reset_after(prev, cur, elapsed) + lag}
end
cur = cur + cost
if cost > 0 and not peek then
  redis.call('HSET', key, 'i', str(index), 'p', str(prev), 'c', str(cur))
  -- Fresh once the current count has aged out of the previous window: end of window index + 1.
  expire_in(key, (index + 2) * window - now)
end
return {1, limit - estimate - cost, 0, reset_after(prev, cur, elapsed) + lag}
