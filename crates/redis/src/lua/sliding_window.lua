-- Sliding window counter. KEYS[1]: the key (hash: i = current window index, p = previous window's
-- count, c = current window's count). ARGV: now_us or '', cost, peek (0/1), window_us, limit,
-- max_count (the largest count a valid state holds).
-- Reply: {allowed, remaining, retry_after_us, reset_after_us}. The algorithm is
-- `sliding_window_decide` (sliding_window_decide.lua), shared with the batch script.
return decide_one(sliding_window_decide)
