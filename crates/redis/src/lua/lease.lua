-- GCRA lease: admit between min and max units at once, as many as the bucket holds (a lease of g
-- units is exactly a GCRA admission of cost g). KEYS[1]: the GCRA key (see tat.lua). ARGV: now_us or
-- '', min, max, units per µs, interval, depth (in units). Reply: {granted, left_in_bucket,
-- retry_after, reset_after} in units; -1 = never.
local key = KEYS[1]
local now = now_us()
local min = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
local per_us, interval, depth = gcra_args()
-- A state written under another quota is carried over (see tat_read), and stored even when nothing
-- is granted.
local ahead, carried = tat_read(key, now, per_us, interval, depth)
if now + cdiv(ahead + depth, per_us) >= LIMIT then
  if carried then
    tat_write(key, now, ahead, per_us, interval, depth)
  end
  return {0, 0, -1, -1}
end
local room = depth - ahead
local avail = 0
if room > 0 then
  avail = idiv(room, interval)
end
if avail < min then
  if carried then
    tat_write(key, now, ahead, per_us, interval, depth)
  end
  return {0, 0, ahead + min * interval - depth, ahead}
end
local grant = math.min(avail, max)
local new_ahead = ahead + grant * interval
set_tat(key, now, new_ahead, per_us, interval, depth)
return {grant, avail - grant, 0, new_ahead}
