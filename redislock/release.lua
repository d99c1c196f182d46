-- release.lua: give up one hold of a lock.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the grant, or "" to match any
-- ARGV[3]  the release channel
--
-- Returns 1 when the lock is now free (and, if an acquisition attempt
--           found it held meanwhile, PUBLISHes on the channel),
--         2 when the token still holds it (reentrant count decremented),
--         0 when the token does not hold it (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
local lock = KEYS[1]
local h = redis.pcall('HMGET', lock, 'owner', 'count', 'fence', 'wait')
if h['err'] then
  return {-1, lock, redis.call('TYPE', lock)['ok']}
end
if h[1] ~= ARGV[1] or (ARGV[2] ~= '' and h[3] ~= ARGV[2]) then
  return 0
end
local n = (tonumber(h[2]) or 1) - 1
if n > 0 then
  redis.call('HSET', lock, 'count', n)
  return 2
end
redis.call('DEL', lock)
if h[4] then
  redis.call('PUBLISH', ARGV[3], h[3] or '')
end
return 1
