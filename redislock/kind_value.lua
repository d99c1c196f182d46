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
-- both, kind_lead_refresh.lua). Returns 1 when stored, 0 when the token's
-- grant does not hold the lock (nothing changed), or {-1, key, type}.
--#include lib.lua
local lock = KEYS[1]
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
if state ~= 'lock' or n == 0 or t ~= ARGV[1] or (ARGV[2] ~= '' and fmt(f) ~= ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[2], fmt(f) .. ':' .. ARGV[3], 'PX', math.max(redis.call('PTTL', lock), 1))
return 1
