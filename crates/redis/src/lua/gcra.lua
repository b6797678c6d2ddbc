-- GCRA. KEYS[1]: the key (string: the TAT in ns, see tat.lua). ARGV: now_us or '', cost, peek (0/1),
-- units per µs, interval, depth (in units). Reply: {allowed, remaining, retry_after, reset_after} in
-- units; -1 = never. The algorithm is `gcra_decide` (tat.lua), shared with the batch script.
local key, now, cost, peek = decision_args()
local per_us, interval, depth = gcra_args()
local allowed, remaining, retry, reset, commit, carry = gcra_decide(key, now, cost, per_us, interval, depth)
-- The admission's write, or else the carry-over of a state written under another quota (stored
-- even by a denial, so that the key does not go on refilling under the quota it left).
local write = commit or carry
if not peek and write then
  tat_write(key, now, write, per_us, interval, depth)
end
return {allowed, remaining, retry, reset}
