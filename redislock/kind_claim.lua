-- kind_claim.lua: a writer that will retry keeps new readers out of a key
-- readers hold (a claim), or withdraws its claim.
--
-- KEYS[1]  the lock, KEYS[2] the writers' claims
-- ARGV[1]  the writer's token
-- ARGV[2]  the claim's TTL in milliseconds, or "" to withdraw it
-- ARGV[3]  the release channel
--
-- A claim is made only while readers hold the key (a marker with flag
-- r). A withdrawal PUBLISHes on the release channel when readers found
-- the key closed, so that they try again at once.
--
-- Returns 1 when a claim was made, 0 otherwise, or {-1, key, type} when
-- the key holds a value of another type.
--#include lib.lua
--#include kind_lib.lua
local lock, x = KEYS[1], KEYS[2]
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
local readers = state == 'lock' and n > 0 and marker_kind(fl, t) == 'r'
if ARGV[2] == '' then
  redis.call('ZREM', x, ARGV[1])
  if readers and has(fl, 'w') then
    redis.call('PUBLISH', ARGV[3], '')
  end
  return 0
end
if not readers then
  return 0
end
local ttl = tonumber(ARGV[2])
if not has(fl, 'x') then
  -- Claims count only under flag x: the claim that sets it starts a new
  -- set (one left by an earlier marker may hold claims of writers that
  -- were served since).
  redis.call('DEL', x)
end
redis.call('ZADD', x, math.floor(now() / 1000) + ttl, ARGV[1])
extend(x, ttl)
flag(lock, f, n, fl, a, t, 'x')
return 1
