-- Several requests in one call: `batch_many`, the function library's second function (FCALL only;
-- crates/redis/src/coalesce.rs sends it), over the definitions of batch.lua. Each request is
-- decided as `batch` decides one, in turn: exactly as if they had come one after the other, each
-- atomic. ARGV: per request three values, as `batch`'s ARGV: now_us or '' (the server's TIME,
-- read once for the call), the cost, the plan. KEYS: each request's keys in turn, as many as its
-- plan has specs. Reply: an array, one bulk string per request: `batch`'s reply, or 'E' and the
-- error that request raised (it wrote nothing; the others are unaffected). A malformed plan or
-- argument count fails the whole call before any write.
local function batch_many()
  if not INT then
    init()
  end
  local nargs, nkeys = #ARGV, #KEYS
  if nargs % 3 ~= 0 then
    error({err = 'ERR the arguments are not triples of time, cost and plan'})
  end
  local plans, base = {}, 0
  for j = 3, nargs, 3 do
    local plan = plan_of(ARGV[j])
    plans[j] = plan
    base = base + #plan[2]
  end
  if base ~= nkeys then
    error({err = 'ERR the plans have ' .. base .. ' key specs for ' .. nkeys .. ' keys'})
  end
  local replies, server_now = {}, nil
  base = 0
  for j = 1, nargs, 3 do
    local plan, now = plans[j + 2], ARGV[j]
    if now == '' then
      if not server_now then
        server_now = server_us()
      end
      now = server_now
    else
      now = tonum(now)
    end
    local n = #plan[2]
    local ok, text = pcall(batch_request, KEYS, base, n, now, num(ARGV[j + 1]), plan)
    if not ok then
      if type(text) == 'table' then
        text = text.err
      end
      text = 'E' .. tostring(text)
    end
    replies[#replies + 1] = text
    base = base + n
  end
  return replies
end
