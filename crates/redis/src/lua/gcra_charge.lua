-- GCRA charge (`gcra_charge`, tat_settle.lua): counts `cost` units at now without a decision.
-- KEYS[1]: the key (see tat.lua). ARGV: now_us or '', cost, unused, units per µs, interval, depth
-- (in units). Reply: {written (0/1), 0, 0, 0}.
local key, now, cost = decision_args()
local per_us, interval, depth = gcra_args()
return {gcra_charge(key, now, cost, per_us, interval, depth), 0, 0, 0}
