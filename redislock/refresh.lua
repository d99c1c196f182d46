-- refresh.lua: extend a lock held by a token.
--
-- KEYS[1]  the lock; KEYS[2], when given, an elected leader's value
--          (kind_value.lua), extended with it
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
local r, f, n, fl, a, t = holding(lock, redis.pcall('GET', lock), ARGV[1], ARGV[2])
if r then
  return r
end
if has(fl, 'c') then
  redis.call('SET', lock, pack(f, n, string.gsub(fl, 'c', ''), a, t), 'KEEPTTL')
end
redis.call('PEXPIRE', lock, ARGV[3], 'GT')
if KEYS[2] then
  redis.call('PEXPIRE', KEYS[2], ARGV[3], 'GT')
end
return 1
