-- GCRA refund (`gcra_refund`, tat_settle.lua): gives back `cost` units admitted earlier. KEYS[1]:
-- the key (see tat.lua). ARGV: now_us or '', cost, unused, units per µs, interval, depth (in units).
-- Reply: {written (0/1), 0, 0, 0}.
local key, now, cost = decision_args()
local per_us, interval, depth = gcra_args()
return {gcra_refund(key, now, cost, per_us, interval, depth), 0, 0, 0}
