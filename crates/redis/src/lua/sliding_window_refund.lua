-- Sliding window counter refund, as the core's `SlidingWindow::refund`: `cost` off the current count
-- while the stored window is now's, off the previous count when a later admission moved the stored
-- window one on (the refund's now being the admission's), saturating; nothing otherwise (the count
-- has aged out, or the stored window is older). A state written under another quota is carried over
-- first (see sliding_window_decide.lua). KEYS[1]: the key (see sliding_window.lua). ARGV:
-- now_us or '', cost, unused, window_us, limit, max_count. Reply: {written (0/1), 0, 0, 0}.
local key, now, cost = decision_args()
local window, limit, max_count = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local si, sp, sc, carry = sliding_window_state(key, now, window, limit, max_count)
local ni = idiv(now, window)
local function nothing()
  if carry then
    carry()
    return {1, 0, 0, 0}
  end
  return {0, 0, 0, 0}
end
if cost <= 0 then
  return nothing()
end
if si == ni and sc > 0 then
  sc = math.max(sc - cost, 0)
elseif si == ni + 1 and sp > 0 then
  sp = math.max(sp - cost, 0)
else
  return nothing()
end
if sp == 0 and sc == 0 then
  -- Both counts zero: the fresh state, the absent key.
  redis.call('DEL', key)
  return {1, 0, 0, 0}
end
redis.call('HSET', key, 'i', str(si), 'p', str(sp), 'c', str(sc), 'q', quota_tag(window, limit, max_count))
-- Fresh once the last non-zero count has aged out: the current one at the end of window si + 1, the
-- previous one at the end of window si.
if sc > 0 then
  expire_in(key, (si + 2) * window - now)
else
  expire_in(key, (si + 1) * window - now)
end
return {1, 0, 0, 0}
