-- Sliding window counter charge (`sliding_window_charge`, sliding_window_settle.lua). KEYS[1]: the
-- key (see sliding_window.lua). ARGV: now_us or '', cost, unused, window_us, limit, max_count.
-- Reply: {written (0/1), 0, 0, 0}.
local key, now, cost = decision_args()
local window, limit, max_count = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
return {sliding_window_charge(key, now, cost, window, limit, max_count), 0, 0, 0}
