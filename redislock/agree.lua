-- agree.lua: give a grant another token and fence (Backend.Adopt): a
-- Redlock acquisition makes the nodes that granted it agree on the fence
-- it settled on.
--
-- KEYS[1]  the lock
-- ARGV[1]  the token the lock was granted to
-- ARGV[2]  the token it is to be held by
-- ARGV[3]  the fence it is to carry
--
-- Returns 1 when ARGV[1] held the lock (now ARGV[2]'s with fence ARGV[3];
--           the deadline is unchanged),
--         0 when it did not (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
--#include lib.lua
local lock = KEYS[1]
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
if state ~= 'lock' or n == 0 or t ~= ARGV[1] then
  return 0
end
local nf = tonumber(ARGV[3])
local ms = ahead(nf, now())
redis.call('SET', lock, pack(nf, n, fl, ms, ARGV[2]), 'KEEPTTL')
return 1
