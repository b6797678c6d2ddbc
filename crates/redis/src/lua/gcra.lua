-- GCRA. KEYS[1]: the key (string: the TAT in ns, see tat.lua). ARGV: now_us or '', cost, peek (0/1),
-- units per µs, interval, depth (in units). Reply: {allowed, remaining, retry_after, reset_after} in
-- units; -1 = never. The algorithm is `gcra_decide` (tat.lua), shared with the batch script.
return decide_one(gcra_decide)
