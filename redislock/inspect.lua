-- inspect.lua: read a lock's state; with ARGV[1] == "1", also delete it
-- whoever holds it (an administrator's forced release).
--
-- KEYS[1]  the lock hash
-- ARGV[1]  "1" to delete the lock
-- ARGV[2]  the release channel, PUBLISHed on when the lock is deleted
--
-- Returns {0}                                 when nobody holds the lock,
--         {1, owner, count, fence, pttl}      when someone does,
--         {-1, key, type}                     when the key holds a value of
--                                             another type (left intact).
local lock = KEYS[1]
local kind = redis.call('TYPE', lock)['ok']
if kind == 'none' then
  return {0}
end
if kind ~= 'hash' then
  return {-1, lock, kind}
end
local h = redis.call('HMGET', lock, 'owner', 'count', 'fence')
if not h[1] then
  return {-1, lock, 'hash'}
end
local pttl = redis.call('PTTL', lock)
if ARGV[1] == '1' then
  redis.call('DEL', lock)
  redis.call('PUBLISH', ARGV[2], h[3] or '')
end
return {1, h[1], tonumber(h[2]) or 1, tonumber(h[3]) or 0, pttl}
