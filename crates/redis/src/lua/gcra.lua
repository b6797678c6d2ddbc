-- GCRA. KEYS[1]: the key (string: the TAT in ns, see tat.lua). ARGV: now_us or '', cost, peek (0/1),
-- units per µs, interval, depth (in units). Reply: {allowed, remaining, retry_after, reset_after} in
-- units; -1 = never.
local key, now, cost, peek = decision_args()
local per_us, interval, depth = gcra_args()
-- ahead = max(tat, now) - now; new_ahead = new_tat - now.
local ahead = tat_ahead(redis.call('GET', key), now, per_us)
local new_ahead = ahead + cost * interval
if now + cdiv(new_ahead, per_us) >= LIMIT then
  return {0, 0, -1, -1}
end
-- allow_at = new_tat - depth; denied while now < allow_at.
local wait = new_ahead - depth
if wait > 0 then
  return {0, 0, wait, ahead}
end
if cost > 0 and not peek then
  -- Fresh again once the TAT is reached: the key lives exactly that long.
  set_tat(key, now, new_ahead, per_us)
end
return {1, idiv(depth - new_ahead, interval), 0, new_ahead}
