-- Several keys decided as one request. KEYS[1..n]: the keys (all on one node; one hash slot on
-- Redis Cluster). ARGV: now_us or '', cost, peek (0/1), then per key, in order, five values: its
-- algorithm ('g': GCRA and the leaky bucket, 'f': fixed window, 's': sliding window), enforcing
-- (1, or 0 for a shadow key), and the algorithm's three parameters, as that algorithm's single-key
-- script takes them.
-- Every key is decided first, at one `now`, on the state it holds, by the same `*_decide` function
-- as its single-key script (reads only); then, unless this is a peek, every key's admission is
-- written only if every enforcing key admitted (a shadow key never denies the request, and its
-- admission is written only with the request's). An error on any key (WRONGTYPE, corrupt state)
-- is raised before any write: nothing is written. It comes back as 'TOLLGATE_KEY <i> <the error>',
-- i being the key's position (from 1).
-- Reply: four integers per key, in order, as its single-key script replies: {allowed, remaining,
-- retry_after, reset_after} in that algorithm's unit, -1 = never; then the `now` every key was
-- decided at, in µs (what a reservation settles against).
local ALGORITHMS = {g = gcra_decide, f = fixed_window_decide, s = sliding_window_decide}
local now, cost, peek = now_us(), tonumber(ARGV[2]), ARGV[3] == '1'
local reply, commits, carries, admitted, seen = {}, {}, {}, true, {}
for i = 1, #KEYS do
  -- A key twice would be decided twice on the same state and written twice (the client refuses it).
  if seen[KEYS[i]] then
    error({err = 'TOLLGATE_KEY ' .. i .. ' ERR the key is in the request twice'})
  end
  seen[KEYS[i]] = true
  local at = 4 + (i - 1) * 5
  local decide = ALGORITHMS[ARGV[at]]
  if decide == nil then
    error({err = 'TOLLGATE_KEY ' .. i .. ' ERR unknown algorithm ' .. shown(ARGV[at])})
  end
  local ok, r, commit, carry = pcall(decide, KEYS[i], now, cost,
    tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]))
  if not ok then
    -- Redis 7 hands pcall the error's message; older versions the error table.
    if type(r) == 'table' then
      r = r.err
    end
    error({err = 'TOLLGATE_KEY ' .. i .. ' ' .. tostring(r)})
  end
  if r[1] == 0 and ARGV[at + 1] == '1' then
    admitted = false
  end
  for j = 1, 4 do
    reply[#reply + 1] = r[j]
  end
  commits[i], carries[i] = commit or false, carry or false
end
if not peek then
  -- Each key's admission when the request is admitted; else (or where it has none) the carry-over
  -- of a state written under another quota, stored even by a denial. After every read: an error
  -- above wrote nothing.
  for j = 1, #KEYS do
    if admitted and commits[j] then
      commits[j]()
    elseif carries[j] then
      carries[j]()
    end
  end
end
reply[#reply + 1] = now
return reply
