-- kind_value.lua: store an elected leader's value with its lock
-- (Backend.SetValue).
--
-- KEYS[1]  the lock, KEYS[2] the value: FENCE ":" VALUE, the fence of the
--          grant it belongs to
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the grant, or "" to match any
-- ARGV[3]  the value
--
-- The value expires with the lock (refreshes of a leader's lock extend
-- both, refresh.lua). Returns 1 when stored, 0 when the token's
-- grant does not hold the lock (nothing changed), or {-1, key, type}.
--#include lib.lua
local lock = KEYS[1]
local r, f = holding(lock, redis.pcall('GET', lock), ARGV[1], ARGV[2])
if r then
  return r
end
redis.call('SET', KEYS[2], fmt(f) .. ':' .. ARGV[3], 'PX', math.max(redis.call('PTTL', lock), 1))
return 1
