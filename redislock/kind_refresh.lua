-- kind_refresh.lua: extend a permit or a read hold.
--
-- KEYS[1]  the lock, KEYS[2] the holds
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the hold, or "" to match any
-- ARGV[3]  the TTL in milliseconds
-- ARGV[4]  the kind: "p" or "r"
--
-- The hold's deadline becomes max(deadline, now + TTL), and the marker
-- and the holds live at least that long.
--
-- Returns 1 when extended (or already later),
--         0 when the token does not hold it (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
--#include lib.lua
--#include kind_lib.lua
local lock, hs = KEYS[1], KEYS[2]
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
if state ~= 'lock' or n == 0 or marker_kind(fl, t) ~= ARGV[4] then
  return 0
end
local ms = math.floor(now() / 1000)
local m = find(hs, ARGV[1], ARGV[2], ms)
if not m then
  return 0
end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', hs, 'XX', 'GT', ms + ttl, m)
-- The marker and the holds' set always have a TTL (GT treats none as
-- infinite).
redis.call('PEXPIRE', hs, ttl, 'GT')
redis.call('PEXPIRE', lock, ttl, 'GT')
return 1
