-- inspect.lua: read a lock's state; with ARGV[1] == "1", also delete it
-- whoever holds it (an administrator's forced release).
--
-- KEYS[1]  the lock, KEYS[2] the FIFO queue
-- ARGV[1]  "1" to delete the lock
-- ARGV[2]  the release channel, PUBLISHed on when the lock is deleted and
--          no FIFO waiter takes it over
-- ARGV[3]  the claim TTL in milliseconds, ARGV[4] the wake channel prefix
--
-- Returns {0, waiters}                            when nobody holds the lock,
--         {1, owner, count, fence, pttl, waiters} when someone does,
--         {-1, key, type}                         when a key holds a value
--                                                 of another type (left
--                                                 intact).
-- waiters counts the FIFO queue's members.
--#include lib.lua
--#include queue_lib.lua
local lock, q = KEYS[1], KEYS[2]
local waiters = redis.pcall('ZCARD', q)
if type(waiters) == 'table' and waiters['err'] then
  return wrong(q)
end
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
if state == 'legacy' then
  local h = redis.call('HMGET', lock, 'owner', 'count', 'fence')
  return {1, h[1], tonumber(h[2]) or 1, tonumber(h[3]) or 0, redis.call('PTTL', lock), waiters}
end
if state ~= 'lock' or n == 0 then
  return {0, waiters}
end
local pttl = redis.call('PTTL', lock)
if ARGV[1] == '1' then
  local err = free_lock(lock, q, f, a, 'q' .. fl .. 'w', ARGV[3], ARGV[4], ARGV[2])
  if err then
    return err
  end
end
return {1, t, n, f, pttl, waiters}
