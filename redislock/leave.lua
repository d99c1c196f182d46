-- leave.lua: a FIFO waiter gives up (its context ended, or its Backend
-- closed).
--
-- KEYS[1]  the lock hash, KEYS[2] the fence counter, KEYS[3] the FIFO
--          queue, KEYS[4] its heartbeats
-- ARGV[1]  the owner token
-- ARGV[2]  the waiter's queue member (Backend id .. token)
-- ARGV[3]  the release channel
-- ARGV[4]  the claim TTL in milliseconds, ARGV[5] the wake channel prefix
--
-- The waiter leaves the queue. If a release handed it the lock and it has
-- not claimed it yet, the lock goes on to the next live waiter (or is
-- freed), as if the waiter had claimed and released it. A lock the token
-- holds and has claimed is left alone: it is a reentrant owner's other
-- hold, or the grant of an abandoned call, which that call's own cleanup
-- releases.
--
-- Returns 1 when a reserved lock was passed on, 0 otherwise, or
-- {-1, key, type} when a key holds a value of another type.
--#include fence.lua
--#include queue_lib.lua
local lock, counter, q, hb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bad = check_queue(q, hb)
if bad then
  return bad
end
redis.call('ZREM', q, ARGV[2])
redis.call('ZREM', hb, ARGV[2])
local h = redis.pcall('HMGET', lock, 'owner', 'claim', 'wait')
if h['err'] then
  return wrong(lock)
end
if h[1] ~= ARGV[1] or not h[2] then
  return 0
end
return free_lock(lock, counter, q, hb, ARGV[4], ARGV[5], ARGV[3], h[3])
