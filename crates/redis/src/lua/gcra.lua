-- GCRA. KEYS[1]: the key (string: the TAT in microseconds). ARGV: now_us or '', cost, peek (0/1),
-- interval_us, depth_us. Reply: {allowed, remaining, retry_after_us, reset_after_us}; -1 = never.
local key, now, cost, peek, interval, depth = decision_args()
local tat = tonumber(redis.call('GET', key) or '0')
local new_tat = math.max(tat, now) + cost * interval
if new_tat >= LIMIT then
  return {0, 0, -1, -1}
end
local allow_at = math.max(new_tat - depth, 0)
if now < allow_at then
  return {0, 0, allow_at - now, math.max(tat - now, 0)}
end
local ahead = new_tat - now
if cost > 0 and not peek then
  -- Fresh again once the TAT is reached: the key lives exactly that long.
  redis.call('SET', key, str(new_tat), 'PX', str(math.max(cdiv(ahead, 1000), 1)))
end
return {1, idiv(depth - ahead, interval), 0, ahead}
