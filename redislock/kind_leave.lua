-- kind_leave.lua: a permit waiter gives up (its context ended, or its
-- Backend closed).
--
-- KEYS[1]  the lock, KEYS[2] the holds, KEYS[3] the permit queue
-- ARGV[1]  the owner token
-- ARGV[2]  the waiter's queue member (Backend id .. token)
--
-- The waiter leaves the queue. Returns the fence of a permit a release
-- handed to it meanwhile (the caller releases it, which hands it on), or
-- 0.
--#include lib.lua
--#include kind_lib.lua
local lock, hs, sq = KEYS[1], KEYS[2], KEYS[3]
redis.pcall('ZREM', sq, ARGV[2])
redis.call('DEL', lock .. ':w:' .. ARGV[2])
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state ~= 'lock' or n == 0 or marker_kind(fl, t) ~= 'p' then
  return 0
end
local m = find(hs, ARGV[1], '', math.floor(now() / 1000))
if not m then
  return 0
end
return tonumber(string.match(m, '^(%d+):'))
