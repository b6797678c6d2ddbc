-- Fixed window refund, as the core's `FixedWindow::refund`: `cost` off the count when the stored
-- window is now's window (where the admission counted it), saturating; nothing when the window has
-- rolled (the count it was in has already reset) or the stored window is later (a clock gone
-- backwards: ambiguous, so stricter). A state written under another quota is carried over first (see
-- fixed_window_decide.lua). KEYS[1]: the key (see fixed_window.lua). ARGV: now_us or '', cost,
-- unused, window_us, limit, max_count. Reply: {written (0/1), 0, 0, 0}.
local key, now, cost = decision_args()
local window, limit, max_count = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local si, sc, carry = fixed_window_state(key, now, window, limit, max_count)
if cost <= 0 or sc == 0 or si ~= idiv(now, window) then
  if carry then
    carry()
    return {1, 0, 0, 0}
  end
  return {0, 0, 0, 0}
end
if cost >= sc then
  -- A count of zero is the fresh state: the absent key.
  redis.call('DEL', key)
  return {1, 0, 0, 0}
end
redis.call('HSET', key, 'i', str(si), 'c', str(sc - cost), 'q', quota_tag(window, limit, max_count))
-- Still fresh once the window ends.
expire_in(key, (si + 1) * window - now)
return {1, 0, 0, 0}
