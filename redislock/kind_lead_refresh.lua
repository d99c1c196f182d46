-- kind_lead_refresh.lua: refresh.lua for a leader's lock, which also
-- extends the leader's value (kind_value.lua).
--
-- KEYS[1]  the lock, KEYS[2] the value
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the grant, or "" to match any
-- ARGV[3]  the TTL in milliseconds
--
-- Returns as refresh.lua.
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
redis.call('PEXPIRE', KEYS[2], ARGV[3], 'GT')
return 1
