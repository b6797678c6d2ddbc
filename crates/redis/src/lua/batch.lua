-- Several keys decided as one request: `batch`, called once per request by the batch script
-- (batch_eval.lua, run by EVALSHA) or by the function library's function (FCALL; see
-- crates/redis/src/function.rs). KEYS[1..n]: the keys (all on one node; one hash slot on Redis
-- Cluster). ARGV[1]: now_us or ''. ARGV[2]: the cost. ARGV[3]: the request's plan, its parts
-- separated by single spaces: peek (0/1), then per key, in order, its spec: its algorithm ('g':
-- GCRA and the leaky bucket, 'f': fixed window, 's': sliding window), enforcing ('1', or '0' for a
-- shadow key), and the algorithm's three parameters as that algorithm's single-key script takes
-- them, joined by ',' (which is the quota tag its state is stored with): '0 g11,1,100000
-- g01,1,5000'. One value for all of them: Redis builds ARGV one element at a time (about 1 k
-- instructions each), and a function library parses a plan it has seen once (a memo: the same
-- rules send the same plan; the cost, which may differ on every request, is not in it).
-- Every key is decided first, at one `now`, on the state it holds, by the same `*_decide` function
-- as its single-key script (reads only); then, unless this is a peek, every key's admission is
-- written only if every enforcing key admitted (a shadow key never denies the request, and its
-- admission is written only with the request's). An error on any key (WRONGTYPE, corrupt state)
-- is raised before any write: nothing is written. It comes back as 'TOLLGATE_KEY <i> <the error>',
-- i being the key's position (from 1).
-- Reply: per key, in order, a window's four integers as its single-key script replies them:
-- {allowed, remaining, retry_after, reset_after} in that algorithm's unit, -1 = never; GCRA's two,
-- {allowed, an admission's reset_after or a denial's retry_after}, from which the client derives
-- the other two with the quota and the cost it sent (an admission's remaining is
-- floor((depth - reset_after) / interval), a denial's reset_after is retry_after + depth -
-- cost × interval, -1 = never for both; crates/redis/src/batch.rs, `TatReply`): each integer
-- costs Redis a `sprintf` (about 1 k instructions). Then the `now` every key was decided at, in
-- µs (what a reservation settles against). All in one bulk string, in decimal, separated by
-- single spaces: the client reads one value instead of an array (redis-rs's reply parser spent
-- about 10 k instructions per 3-key call on an array, a tenth of tollgate-server's work per
-- call).
local WINDOWS = {f = fixed_window_decide, s = sliding_window_decide}
-- The most keys whose reply's format is memoized by its shape (see reply_text).
local COMPACT_MAX = 40
-- The position of the key being decided, for the error that names it.
local batch_at = 0
local function spec_of(spec)
  -- {algorithm, enforcing (a boolean), the three parameters, the quota tag} of a key's spec. The
  -- tag is the parameters as sent (the client sends plain digits: quota_tag of their numbers).
  local code, enforcing, tag, a, b, c = match(spec, '^(%a)([01])((%d+),(%d+),(%d+))$')
  if not code or #a > 16 or #b > 16 or #c > 16 then
    error({err = 'ERR the key spec ' .. shown(spec) .. ' is not an algorithm, 0/1 and three integers'})
  end
  return {code, enforcing == '1', tonum(a), tonum(b), tonum(c), tag}
end
-- Plans parsed, by their text (a memo, as those in the prelude): {peek (a boolean), the keys'
-- specs (spec_of), whether every key is GCRA's (a boolean: batch_many may hold their states)}.
local PLANS, PLANS_N = {}, 0
local function plan_of(text)
  local p = PLANS[text]
  if p then
    return p
  end
  local peek, rest
  if type(text) == 'string' then
    peek, rest = match(text, '^([01])(.*)$')
  end
  if not peek then
    error({err = 'ERR the plan ' .. shown(text) .. ' is not 0/1 and key specs'})
  end
  -- A request's rules often share a quota, so its keys the same spec: each parsed once (what
  -- counts where no memo outlives the call, the EVALSHA fallback).
  local specs, parsed, gcra = {}, {}, true
  for spec in string.gmatch(rest, ' ([^ ]*)') do
    local e = parsed[spec]
    if not e then
      e = spec_of(spec)
      parsed[spec] = e
    end
    specs[#specs + 1] = e
    gcra = gcra and e[1] == 'g'
  end
  p = {peek == '1', specs, gcra}
  if PLANS_N >= MEMO_MAX then
    PLANS, PLANS_N = {}, 0
  end
  PLANS[text], PLANS_N = p, PLANS_N + 1
  return p
end
local function batch_decide(keys, base, n, now, cost, specs, reply, commits, carries, params)
  -- Every key's decision at `now` (reads only): the request's keys are keys[base + 1 .. base + n].
  -- Its reply values put in `reply` (see reply_text; their count is returned), its writes kept
  -- (commits[i]: the admission's, carries[i]: the carry-over's; false: none; for GCRA the ahead
  -- tat_write stores, its spec in params[i]; for the windows a function, params[i] false:
  -- batch_commit tells them apart by it, not by a call of `type`). Returns whether every
  -- enforcing key admitted, the reply's shape and its count of values (see reply_text).
  local admitted, shape, compact, m = true, 0, n <= COMPACT_MAX, 0
  -- The keys seen, for more than a few (fewer are compared pairwise: no table to build).
  local seen
  if n > 8 then
    seen = {}
  end
  for i = 1, n do
    batch_at = i
    local key = keys[base + i]
    -- A key twice would be decided twice on the same state and written twice (the client refuses it).
    if seen then
      if seen[key] then
        error({err = 'ERR the key is in the request twice'})
      end
      seen[key] = true
    else
      for j = 1, i - 1 do
        if keys[base + j] == key then
          error({err = 'ERR the key is in the request twice'})
        end
      end
    end
    local spec = specs[i]
    local code, a, b, c = spec[1], spec[3], spec[4], spec[5]
    local allowed, remaining, retry, reset, commit, carry
    if code == 'g' then
      -- Where batch_many holds the states (HELD) and the unit is 1 µs (a = 1: an interval of
      -- whole µs, the fleet's quotas), a key read as none, or written earlier in the call under
      -- this quota, is decided here: gcra_decide's arithmetic, term for term, without its three
      -- Lua calls per key (tat_read, tat_ahead and the remaining's idiv, which GCRA's reply does
      -- not carry), about 13 % of the redis-server's work per request in a group of 14
      -- (lua_instructions.sh). Any other state (a stored value to parse, another quota: a
      -- carry-over, a TAT past AHEAD_MAX: corrupt) goes to gcra_decide.
      local held, raw, ahead = HELD, nil, nil
      if held and a == 1 then
        raw = held[key]
        if raw == nil then
          raw = redis.call('GET', key)
          held[key] = raw
        end
        if raw == false then
          ahead = 0
        elseif type(raw) == 'number' and HELD_TAG[key] == spec[6] then
          -- Written by set_tat under this quota: whole µs, its nanosecond part 0.
          ahead = raw - now
          if ahead < 0 then
            ahead = 0
          elseif ahead > AHEAD_MAX then
            ahead = nil
          end
        end
      end
      if ahead then
        local new_ahead = ahead + cost * b
        if now + new_ahead >= LIMIT then
          allowed, remaining, retry, reset = 0, 0, -1, -1
        elseif new_ahead > c then
          allowed, remaining, retry, reset = 0, 0, new_ahead - c, ahead
        else
          allowed, retry, reset = 1, 0, new_ahead
          if cost > 0 then
            commit = new_ahead
          end
        end
      else
        allowed, remaining, retry, reset, commit, carry = gcra_decide(key, now, cost, a, b, c, spec[6])
      end
      params[i] = spec
    else
      local decide = WINDOWS[code]
      if decide == nil then
        error({err = 'ERR unknown algorithm ' .. shown(code)})
      end
      local r
      r, commit, carry = decide(key, now, cost, a, b, c)
      params[i] = false
      allowed, remaining, retry, reset = r[1], r[2], r[3], r[4]
    end
    if allowed == 0 and spec[2] then
      admitted = false
    end
    -- GCRA's reply is `allowed` and one value, an admission's reset_after or a denial's
    -- retry_after (the client derives the other two: TatReply in batch.rs).
    if compact then
      -- Every *_decide answers an admission's retry_after 0 and a denial's remaining 0: the
      -- format holds those and `allowed` (the shape), the reply the others.
      if allowed == 1 and retry == 0 then
        shape = shape * 2 + 1
      elseif allowed == 0 and remaining == 0 then
        shape = shape * 2
      else
        error({err = 'ERR a decision of ' .. shown(code) .. ' is not an admission or a denial'})
      end
      if code == 'g' then
        reply[m + 1], m = allowed == 1 and reset or retry, m + 1
      else
        reply[m + 1], reply[m + 2], m = allowed == 1 and remaining or retry, reset, m + 2
      end
    elseif code == 'g' then
      -- Every value formatted (see reply_text).
      reply[m + 1], reply[m + 2], m = allowed, allowed == 1 and reset or retry, m + 2
    else
      reply[m + 1], reply[m + 2], reply[m + 3], reply[m + 4] = allowed, remaining, retry, reset
      m = m + 4
    end
    commits[i], carries[i] = commit or false, carry or false
  end
  return admitted, shape, m
end
-- The reply, and each key's writes and spec (see batch_decide), kept from call to call by a
-- function library (no tables to build and grow on each call): a call sets entries 1..#KEYS of
-- COMMITS, CARRIES and PARAMS before it reads any, and the entries past those are never read; it
-- sets the reply's values (see reply_text) and formats those.
local REPLY, COMMITS, CARRIES, PARAMS = {}, {}, {}, {}
-- The reply's formats for up to COMPACT_MAX keys, by plan (plan_of), then by shape: each key's
-- allowed as a bit, the first key's the highest ('1 %d' and '0 %d' for GCRA's admission and
-- denial, '1 %d 0 %d' and '0 0 %d %d' for a window's, then INT for `now`). A memo of at most
-- MEMO_MAX formats. `format` costs about 1 k instructions per integer (lua_instructions.sh,
-- callgrind), so the constant values are written in the format text instead; looking each value
-- up in the digits memo saved about 3 k instructions per call where the keys expire between calls
-- and cost about 5 k where they live (their values recur less).
local REPLY_FORMATS, REPLY_FORMATS_N = {}, 0
local function reply_format(specs, shape)
  local n = #specs
  local parts, bits = {}, shape
  for i = n, 1, -1 do
    local bit, gcra = bits % 2, specs[i][1] == 'g'
    if bit == 1 then
      parts[i] = gcra and '1 ' .. INT or '1 ' .. INT .. ' 0 ' .. INT
    else
      parts[i] = gcra and '0 ' .. INT or '0 0 ' .. INT .. ' ' .. INT
    end
    bits = (bits - bit) / 2
  end
  parts[n + 1] = INT
  return table.concat(parts, ' ')
end
local function reply_text(reply, m, plan, shape, now)
  -- The reply of the plan's keys, whose m values batch_decide put in `reply`: for up to
  -- COMPACT_MAX keys those `format` does not hold (see REPLY_FORMATS) and `shape` says which
  -- format; for more, every value, value by value.
  m = m + 1
  reply[m] = now
  local specs = plan[2]
  if #specs <= COMPACT_MAX then
    local by_shape = REPLY_FORMATS[plan]
    if not by_shape then
      by_shape = {}
      REPLY_FORMATS[plan] = by_shape
    end
    local f = by_shape[shape]
    if not f then
      f = reply_format(specs, shape)
      if REPLY_FORMATS_N >= MEMO_MAX then
        REPLY_FORMATS, REPLY_FORMATS_N, by_shape = {}, 0, {}
        REPLY_FORMATS[plan] = by_shape
      end
      by_shape[shape], REPLY_FORMATS_N = f, REPLY_FORMATS_N + 1
    end
    return format(f, unpack(reply, 1, m))
  end
  -- Rare (many keys): value by value, as many as Lua's stack would not take at once.
  local parts = {}
  for i = 1, m do
    parts[i] = format(INT, reply[i])
  end
  return table.concat(parts, ' ')
end
local function batch_error(r)
  -- The error batch_decide raised, naming the key it was deciding: 'TOLLGATE_KEY <i> <error>'.
  -- Redis 7 hands pcall the error's message; older versions the error table.
  if type(r) == 'table' then
    r = r.err
  end
  return 'TOLLGATE_KEY ' .. batch_at .. ' ' .. tostring(r)
end
local function batch_commit(keys, base, n, now, plan, admitted, shape, m)
  -- After batch_decide (whose kept writes are in COMMITS, CARRIES and PARAMS) on
  -- keys[base + 1 .. base + n]: the request's writes, and its reply's text. Each key's admission
  -- when the request is admitted; else (or where it has none) the carry-over of a state written
  -- under another quota, stored even by a denial. Nothing here raises an error on keys every
  -- decision read: a write replaces or deletes a value of the type just read. `plan`: the
  -- request's (plan_of); `shape` and `m`: batch_decide's.
  local reply, commits, carries, params = REPLY, COMMITS, CARRIES, PARAMS
  if not plan[1] then
    for i = 1, n do
      local write = carries[i]
      if admitted and commits[i] then
        write = commits[i]
      end
      if write then
        local spec = params[i]
        if spec and write ~= 0 and HELD and spec[3] == 1 then
          -- set_tat's held write written out for a unit of 1 µs (see batch_decide): the TAT
          -- `write` µs past now, a TTL of ceil(write / 1000) ms (at least 1: write > 0). `%`
          -- floors the float quotient, which for an integer below 2^53 is exact or one too high
          -- (then r < 0 and the quotient is already the ceiling).
          local key = keys[base + i]
          local r = write % 1000
          local ms = (write - r) / 1000
          if r > 0 then
            ms = ms + 1
          end
          HELD[key], HELD_NS[key], HELD_TAG[key], HELD_TTL[key] = now + write, 0, spec[6], ms
        elseif spec and write ~= 0 then
          -- tat_write's store, called directly (a Lua call fewer per key).
          set_tat(keys[base + i], now, write, spec[3], spec[4], spec[5], spec[6])
        elseif spec then
          tat_write(keys[base + i], now, 0)
        else
          write()
        end
      end
    end
  end
  return reply_text(reply, m, plan, shape, now)
end
local function batch()
  -- One request reads each key once: nothing to hold (a call of batch_many that failed may have
  -- left HELD set).
  HELD = nil
  local now, cost, plan = now_us(), num(ARGV[2]), plan_of(ARGV[3])
  local n = #KEYS
  if #plan[2] ~= n then
    error({err = 'ERR the plan has ' .. #plan[2] .. ' key specs for ' .. n .. ' keys'})
  end
  local ok, admitted, shape, m = pcall(batch_decide, KEYS, 0, n, now, cost, plan[2], REPLY,
    COMMITS, CARRIES, PARAMS)
  if not ok then
    -- Every read comes before any write: nothing was written.
    error({err = batch_error(admitted)})
  end
  return batch_commit(KEYS, 0, n, now, plan, admitted, shape, m)
end
