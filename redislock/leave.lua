-- leave.lua: a FIFO waiter gives up (its context ended, or its Backend
-- closed).
--
-- KEYS[1]  the lock, KEYS[2] the FIFO queue
-- ARGV[1]  the owner token
-- ARGV[2]  the waiter's queue member (Backend id .. token)
-- ARGV[3]  the release channel
-- ARGV[4]  the claim TTL in milliseconds, ARGV[5] the wake channel prefix
--
-- The waiter leaves the queue. If a release handed it the lock and it has
-- not confirmed it yet (flag c), the lock goes on to the next live waiter
-- (or is freed). A lock the token holds and has confirmed is left alone:
-- it is an earlier grant of the same owner, or the grant of an abandoned
-- call, which that call's own cleanup releases. A writer that leaves a
-- key readers hold PUBLISHes on the release channel when readers found it
-- held, so that the readers it kept out try again at once.
--
-- Returns 1 when a reserved lock was passed on, 0 otherwise, or
-- {-1, key, type} when a key holds a value of another type.
--#include lib.lua
--#include queue_lib.lua
local lock, q = KEYS[1], KEYS[2]
local rm = redis.pcall('ZREM', q, ARGV[2])
if type(rm) == 'table' and rm['err'] then
  return wrong(q)
end
redis.call('DEL', beat(lock, ARGV[2]))
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
if state == 'lock' and n > 0 and t == '' and has(fl, 'r') then
  -- Readers hold the key: a writer that leaves may let in the readers it
  -- kept out, which wait for the release message (when one found the key
  -- held: flag w).
  if rm == 1 and has(fl, 'w') then
    redis.call('PUBLISH', ARGV[3], '')
  end
  return 0
end
if state ~= 'lock' or n == 0 or t ~= ARGV[1] or not has(fl, 'c') then
  return 0
end
local err = free_lock(lock, q, f, a, fl, ARGV[4], ARGV[5], ARGV[3])
if err then
  return err
end
return 1
