-- Fixed window. KEYS[1]: the key (hash: i = window index, c = units admitted in it). ARGV: now_us or
-- '', cost, peek (0/1), window_us, limit, max_count (the largest count a valid state holds).
-- Reply: {allowed, remaining, retry_after_us, reset_after_us}. The algorithm is
-- `fixed_window_decide` (fixed_window_decide.lua), shared with the batch script.
return decide_one(fixed_window_decide)
