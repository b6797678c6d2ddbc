-- Several requests in one call: `batch_many`, the function library's second function (FCALL only;
-- crates/redis/src/coalesce.rs sends it), over the definitions of batch.lua. Each request is
-- decided as `batch` decides one, in turn: exactly as if they had come one after the other, each
-- atomic. ARGV: per request two values: its cost, or its cost, '@' and its now_us where it brings
-- its own time (else the server's TIME, read once for the call); then its plan, as `batch`'s.
-- KEYS: each request's keys in turn, as many as its plan has specs. Reply: an array, one bulk
-- string per request: `batch`'s reply, or 'E' and the error its decision raised (it wrote nothing;
-- the others are unaffected; a malformed cost is its request's error). A malformed plan or
-- argument count fails the whole call before any write.
local function batch_many()
  if not INT then
    init()
  end
  local nargs, nkeys = #ARGV, #KEYS
  if nargs % 2 ~= 0 then
    error({err = 'ERR the arguments are not pairs of cost and plan'})
  end
  -- Where every key is GCRA's, the states are held (see HELD in tat.lua): a key several requests
  -- touch is read and written once. A window's writes go straight to Redis, so a call with one
  -- holds none.
  local plans, base, hold = {}, 0, nargs > 2
  HELD = nil
  for j = 2, nargs, 2 do
    local plan = plan_of(ARGV[j])
    plans[j] = plan
    base = base + #plan[2]
    hold = hold and plan[3]
  end
  if base ~= nkeys then
    error({err = 'ERR the plans have ' .. base .. ' key specs for ' .. nkeys .. ' keys'})
  end
  if hold then
    HELD, HELD_NS, HELD_TAG, HELD_TTL = {}, {}, {}, {}
  end
  local replies, server_now = {}, nil
  base = 0
  for j = 1, nargs, 2 do
    local plan, cost, now = plans[j + 1], num(ARGV[j]), nil
    if cost then
      if not server_now then
        server_now = server_us()
      end
      now = server_now
    else
      local c, t = match(ARGV[j], '^(%d+)@(%d+)$')
      cost, now = tonum(c), tonum(t)
    end
    local n = #plan[2]
    if not cost then
      replies[#replies + 1] = 'EERR the cost ' .. shown(ARGV[j]) .. ' is not an integer (@ a time)'
    else
      local ok, admitted, shape, m = pcall(batch_decide, KEYS, base, n, now, cost, plan[2], REPLY,
        COMMITS, CARRIES, PARAMS)
      if ok then
        replies[#replies + 1] = batch_commit(KEYS, base, n, now, plan, admitted, shape, m)
      else
        replies[#replies + 1] = 'E' .. batch_error(admitted)
      end
    end
    base = base + n
  end
  if hold then
    tat_flush()
    HELD = nil
  end
  return replies
end
