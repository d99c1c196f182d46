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
--           Backend told on its wake channel), or else is deleted or left
--           as a tombstone (and, if a TryAcquire found it held meanwhile,
--           the release channel is PUBLISHed on),
--         2 when the token still holds it (count decremented),
--         0 when the token does not hold it (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
--
-- The common case, the last hold of a lock nobody waited for, comes first
-- and creates no function of lib.lua: two redis.calls (GET, then DEL, or
-- SET of the tombstone when the fence ran ahead of the clock), and the
-- value compared as a whole or with one pattern.
local lock, token, fa = KEYS[1], ARGV[1], ARGV[2]
local v = redis.pcall('GET', lock)
if fa ~= '' and type(v) == 'string' then
  if v == fa .. ':1::0:' .. token then
    redis.call('DEL', lock)
    return 1
  end
  local ma, mt = string.match(v, '^' .. fa .. ':1::(%d+):(.*)$')
  if mt == token then
    -- The tombstone lives until the server clock passes the fence.
    redis.call('SET', lock, fa .. ':0::' .. ma .. ':', 'PXAT', string.format('%d', math.floor(tonumber(fa) / 1000)))
    return 1
  end
end
--#include lib.lua
local r, f, n, fl, a, t = holding(lock, v, token, fa)
if r then
  return r
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
