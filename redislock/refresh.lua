-- refresh.lua: extend a lock held by a token.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the grant, or "" to match any
-- ARGV[3]  the new TTL in milliseconds
--
-- A lock handed over to a FIFO waiter and not claimed yet (field claim) is
-- claimed by its holder's refresh: the waiter may hold it from the hand-off
-- message on, and its first renewal confirms it (see fifo.go).
--
-- Returns 1 when extended,
--         0 when the token does not hold the lock (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
local lock = KEYS[1]
local h = redis.pcall('HMGET', lock, 'owner', 'fence', 'claim')
if h['err'] then
  return {-1, lock, redis.call('TYPE', lock)['ok']}
end
if h[1] ~= ARGV[1] or (ARGV[2] ~= '' and h[2] ~= ARGV[2]) then
  return 0
end
if h[3] then
  redis.call('HDEL', lock, 'claim')
end
redis.call('PEXPIRE', lock, ARGV[3])
return 1
