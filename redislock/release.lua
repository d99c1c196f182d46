-- release.lua: give up one hold of a lock.
--
-- KEYS[1]  the lock, KEYS[2] the FIFO queue
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the grant, or "" to match any
-- ARGV[3]  the release channel
-- ARGV[4]  the claim TTL in milliseconds, ARGV[5] the wake channel prefix
--
-- Returns 1 when the token's last hold is given up: the lock goes to the
--           first live FIFO waiter (handed over with a new fence, its
--           Backend told on its wake channel), or else is deleted (and, if
--           a TryAcquire found it held meanwhile, the release channel is
--           PUBLISHed on),
--         2 when the token still holds it (count decremented),
--         0 when the token does not hold it (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
--
-- The common case, the last hold of a lock nobody waited for, makes two
-- redis.calls (GET, DEL) and creates no queue function.
--#include lib.lua
local lock = KEYS[1]
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
if state ~= 'lock' or n == 0 or t ~= ARGV[1] or (ARGV[2] ~= '' and fmt(f) ~= ARGV[2]) then
  return 0
end
if n > 1 then
  redis.call('SET', lock, pack(f, n - 1, fl, a, t), 'KEEPTTL')
  return 2
end
if fl == '' then
  free(lock, f, a)
  return 1
end
--#include queue_lib.lua
local err = free_lock(lock, KEYS[2], f, a, fl, ARGV[4], ARGV[5], ARGV[3])
if err then
  return err
end
return 1
