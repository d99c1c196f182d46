-- refresh.lua: extend a lock held by a token.
--
-- KEYS[1]  the lock
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the grant, or "" to match any
-- ARGV[3]  the TTL in milliseconds
--
-- The deadline becomes max(deadline, now + TTL): a refresh never shortens
-- a lock. A lock handed to a FIFO waiter and not confirmed yet (flag c) is
-- confirmed by its holder's refresh (see fifo.go).
--
-- Returns 1 when extended (or already later),
--         0 when the token does not hold the lock (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
--#include lib.lua
local lock = KEYS[1]
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
if state ~= 'lock' or n == 0 or t ~= ARGV[1] or (ARGV[2] ~= '' and fmt(f) ~= ARGV[2]) then
  return 0
end
if has(fl, 'c') then
  redis.call('SET', lock, pack(f, n, string.gsub(fl, 'c', ''), a, t), 'KEEPTTL')
end
redis.call('PEXPIRE', lock, ARGV[3], 'GT')
return 1
