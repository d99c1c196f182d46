-- acquire_all.lua: one attempt to take several locks of one Redis Cluster
-- slot, all or none (Backend.TryAcquireAll).
--
-- KEYS     the locks
-- ARGV     three per lock: the owner token, the lease TTL in
--          milliseconds, "1" when reentrant
--
-- Returns {1, fence1, count1, fence2, count2, ...} when every lock is now
--           held by its token (each with its own fence),
--         {0, pttl1, pttl2, ...} when some lock is held by another token:
--           nothing was taken; pttl is the holder's remaining TTL for such
--           a lock (-1: no TTL) and -3 for a lock that did not stand in
--           the way,
--         {-1, key, type} when a key holds a value of another type
--           (nothing was taken).
--#include lib.lua
local n = #KEYS
local t = now()
local locks, pttls = {}, {}
local blocked = false

for i = 1, n do
  local lock, token = KEYS[i], ARGV[3 * i - 2]
  local state, f, c, fl, a, ot = decode(lock, redis.pcall('GET', lock))
  pttls[i] = -3
  if state == 'wrong' then
    return f
  end
  if state == 'legacy' or (state == 'lock' and c > 0 and (ot ~= token or (ARGV[3 * i] ~= '1' and not has(fl, 'c')))) then
    if state == 'lock' and not has(fl, 'w') then
      redis.call('SET', lock, pack(f, c, fl .. 'w', a, ot), 'KEEPTTL')
    end
    pttls[i] = redis.call('PTTL', lock)
    blocked = true
  elseif state == 'lock' then
    locks[i] = {f, c, fl, a, ot}
  end
end

if blocked then
  local out = {0}
  for i = 1, n do
    out[i + 1] = pttls[i]
  end
  return out
end

local out = {1}
for i = 1, n do
  local lock, token, ttl = KEYS[i], ARGV[3 * i - 2], ARGV[3 * i - 1]
  local h = locks[i]
  local granted
  if h and h[2] > 0 then
    granted = rehold(lock, ttl, ARGV[3 * i], h[1], h[2], h[3], h[4], h[5])
  else
    local f = t
    if h then
      f = math.max(f, h[1] + 1) -- a tombstone
    end
    redis.call('SET', lock, pack(f, 1, '', ahead(f, t), token), 'PX', ttl)
    granted = {1, f, 1}
  end
  out[2 * i] = granted[2]
  out[2 * i + 1] = granted[3]
end
return out
