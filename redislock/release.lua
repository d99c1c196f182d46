-- release.lua: give up one hold of a lock.
--
-- KEYS[1]  the lock hash, KEYS[2] the fence counter, KEYS[3] the FIFO
--          queue, KEYS[4] its heartbeats
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the grant, or "" to match any
-- ARGV[3]  the release channel
-- ARGV[4]  the claim TTL in milliseconds, ARGV[5] the wake channel prefix
--
-- Returns 1 when the token's last hold is given up: the lock goes to the
--           first live FIFO waiter (handed over with a new fence, its
--           Backend told on its wake channel), or else is deleted (and, if
--           an acquisition attempt found it held meanwhile, the release
--           channel is PUBLISHed on),
--         2 when the token still holds it (reentrant count decremented),
--         0 when the token does not hold it (nothing changed),
--         {-1, key, type} when a key holds a value of another type.
--
-- The common case, a last hold of a lock nobody queued behind (no field
-- q), makes two redis.calls (HMGET, DEL) and creates no function.
local lock, counter, q, hb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local h = redis.pcall('HMGET', lock, 'owner', 'count', 'fence', 'wait', 'q')
if h['err'] == nil then
  if h[1] ~= ARGV[1] or (ARGV[2] ~= '' and h[3] ~= ARGV[2]) then
    return 0
  end
  local n = (tonumber(h[2]) or 1) - 1
  if n > 0 then
    redis.call('HSET', lock, 'count', n)
    return 2
  end
  if not h[5] then
    redis.call('DEL', lock)
    if h[4] then
      redis.call('PUBLISH', ARGV[3], '')
    end
    return 1
  end
end
--#include fence.lua
if h['err'] then
  return wrong(lock)
end
--#include queue_lib.lua
return free_lock(lock, counter, q, hb, ARGV[4], ARGV[5], ARGV[3], h[4])
