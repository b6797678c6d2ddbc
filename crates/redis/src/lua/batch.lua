-- Several keys decided as one request: `batch`, called once per request by the batch script
-- (batch_eval.lua, run by EVALSHA) or by the function library's function (FCALL; see
-- crates/redis/src/function.rs). KEYS[1..n]: the keys (all on one node; one hash slot on Redis
-- Cluster). ARGV: now_us or '', cost, peek (0/1), then per key, in order, five values: its
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
local WINDOWS = {f = fixed_window_decide, s = sliding_window_decide}
-- The position of the key being decided, for the error that names it.
local batch_at = 0
-- Quota tags by their parameters' strings (a memo, as those in the prelude): {a, b, tag} under c.
local TAGS, TAGS_N = {}, 0
local function tag_of(a, b, c)
  -- The quota tag of the parameters sent as the strings a, b, c: a,b,c (the client sends plain
  -- digits, so this is quota_tag of their numbers), without formatting the numbers again.
  local e = TAGS[c]
  if e and e[1] == a and e[2] == b then
    return e[3]
  end
  local tag = a .. ',' .. b .. ',' .. c
  if TAGS_N >= MEMO_MAX then
    TAGS, TAGS_N = {}, 0
  end
  TAGS[c], TAGS_N = {a, b, tag}, TAGS_N + 1
  return tag
end
local function batch_decide(now, cost, reply, commits, carries, params)
  -- Every key's decision at `now` (reads only), its four reply values appended to `reply`, its
  -- writes kept (commits[i]: the admission's, carries[i]: the carry-over's; false: none; for GCRA
  -- the ahead tat_write stores, its parameters and quota tag in params[4i-3..4i]; for the windows
  -- a function). Returns whether every enforcing key admitted.
  local seen, admitted = {}, true
  for i = 1, #KEYS do
    batch_at = i
    local key = KEYS[i]
    -- A key twice would be decided twice on the same state and written twice (the client refuses it).
    if seen[key] then
      error({err = 'ERR the key is in the request twice'})
    end
    seen[key] = true
    local at = i * 5 - 1
    local code = ARGV[at]
    local sa, sb, sc = ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
    local a, b, c = num(sa), num(sb), num(sc)
    local allowed, remaining, retry, reset, commit, carry
    if code == 'g' then
      local tag = tag_of(sa, sb, sc)
      allowed, remaining, retry, reset, commit, carry = gcra_decide(key, now, cost, a, b, c, tag)
      local p = i * 4
      params[p - 3], params[p - 2], params[p - 1], params[p] = a, b, c, tag
    else
      local decide = WINDOWS[code]
      if decide == nil then
        error({err = 'ERR unknown algorithm ' .. shown(code)})
      end
      local r
      r, commit, carry = decide(key, now, cost, a, b, c)
      allowed, remaining, retry, reset = r[1], r[2], r[3], r[4]
    end
    if allowed == 0 and ARGV[at + 1] == '1' then
      admitted = false
    end
    local m = i * 4
    reply[m - 3], reply[m - 2], reply[m - 1], reply[m] = allowed, remaining, retry, reset
    commits[i], carries[i] = commit or false, carry or false
  end
  return admitted
end
local function batch()
  local now, cost, peek = now_us(), num(ARGV[2]), ARGV[3] == '1'
  local reply, commits, carries, params = {}, {}, {}, {}
  local ok, admitted = pcall(batch_decide, now, cost, reply, commits, carries, params)
  if not ok then
    -- Redis 7 hands pcall the error's message; older versions the error table.
    local r = admitted
    if type(r) == 'table' then
      r = r.err
    end
    error({err = 'TOLLGATE_KEY ' .. batch_at .. ' ' .. tostring(r)})
  end
  if not peek then
    -- Each key's admission when the request is admitted; else (or where it has none) the carry-over
    -- of a state written under another quota, stored even by a denial. After every read: an error
    -- above wrote nothing.
    for i = 1, #KEYS do
      local write = carries[i]
      if admitted and commits[i] then
        write = commits[i]
      end
      if type(write) == 'function' then
        write()
      elseif write then
        local p = i * 4
        tat_write(KEYS[i], now, write, params[p - 3], params[p - 2], params[p - 1], params[p])
      end
    end
  end
  reply[#reply + 1] = now
  return reply
end
