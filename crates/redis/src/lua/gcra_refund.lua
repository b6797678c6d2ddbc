-- GCRA refund: gives back `cost` units admitted earlier, as the core's `Gcra::refund` does: the TAT
-- moves back by cost × interval, never below now (a TAT at or before now is a full bucket, so that is
-- the core's `TAT − cost × T` as every later decision sees it). KEYS[1]: the key (see tat.lua). ARGV:
-- now_us or '', cost, unused, units per µs, interval, depth (in units). Reply: {written (0/1), 0, 0,
-- 0}.
local key, now, cost = decision_args()
local per_us, interval, depth = gcra_args()
-- A state written under another quota is carried over first (see tat_read).
local ahead, carry = tat_read(key, now, per_us, interval, depth)
if cost <= 0 or ahead == 0 then
  -- Nothing to give back: the bucket is already full at now (a TAT in the past is not rewritten).
  if carry then
    carry()
    return {1, 0, 0, 0}
  end
  return {0, 0, 0, 0}
end
-- cost < cdiv(ahead, interval) <= 2^52 / interval keeps cost × interval below ahead: exact. A larger
-- cost (any u64, as a double) empties the TAT to now: the fresh state, which is the absent key.
if cost >= cdiv(ahead, interval) then
  redis.call('DEL', key)
  return {1, 0, 0, 0}
end
-- Fresh again at the new TAT: the key lives that long.
set_tat(key, now, ahead - cost * interval, per_us, interval, depth)
return {1, 0, 0, 0}
