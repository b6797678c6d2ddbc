-- Fixed window. KEYS[1]: the key (hash: i = window index, c = units admitted in it). ARGV: now_us or
-- '', cost, peek (0/1), window_us, limit, max_count (the largest count a valid state holds).
-- Reply: {allowed, remaining, retry_after_us, reset_after_us}.
local key, now, cost, peek = decision_args()
local window, limit, max_count = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
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
if cost > 0 and not peek then
  redis.call('HSET', key, 'i', str(index), 'c', str(used))
  -- Fresh once the window ends.
  expire_in(key, until_end)
end
return {1, limit - used, 0, reset}
