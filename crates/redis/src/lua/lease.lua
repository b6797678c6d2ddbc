-- GCRA lease: admit between min and max units at once, as many as the bucket holds (a lease of g
-- units is exactly a GCRA admission of cost g). KEYS[1]: the GCRA key. ARGV: now_us or '', min, max,
-- interval_us, depth_us. Reply: {granted, left_in_bucket, retry_after_us, reset_after_us}.
local key = KEYS[1]
local now = now_us()
local min = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
local interval = tonumber(ARGV[4])
local depth = tonumber(ARGV[5])
local tat = tonumber(redis.call('GET', key) or '0')
local base = math.max(tat, now)
if base + depth >= LIMIT then
  return {0, 0, -1, -1}
end
local room = now + depth - base
local avail = 0
if room > 0 then
  avail = idiv(room, interval)
end
if avail < min then
  return {0, 0, math.max(base + min * interval - depth, 0) - now, math.max(tat - now, 0)}
end
local grant = math.min(avail, max)
local new_tat = base + grant * interval
redis.call('SET', key, str(new_tat), 'PX', str(math.max(cdiv(new_tat - now, 1000), 1)))
return {grant, avail - grant, 0, new_tat - now}
