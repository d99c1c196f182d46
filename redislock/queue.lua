-- queue.lua: one step of a FIFO wait (Backend.Wait): take the lock, claim
-- it when a release handed it over, or join the queue / stay in it (the
-- heartbeat).
--
-- KEYS[1]  the lock hash, KEYS[2] the fence counter, KEYS[3] the FIFO
--          queue, KEYS[4] its heartbeats
-- ARGV[1]  the owner token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  "1" when the request is reentrant
-- ARGV[4]  the waiter's queue member (Backend id .. token)
-- ARGV[5]  the waiter's arrival number, "0" for a new waiter
-- ARGV[6]  the waiter TTL in milliseconds: the heartbeat deadline is now
--          plus this
-- ARGV[7]  the claim TTL in milliseconds, ARGV[8] the wake channel prefix
--
-- Returns {1, fence, count}        when the token holds the lock now (the
--                                  lock has the lease TTL, the waiter left
--                                  the queue),
--         {0, pttl, seq, head, d}  when the waiter is queued: pttl is the
--                                  lock's remaining TTL when the waiter is
--                                  first in line (-1: none or not
--                                  first), seq the
--                                  waiter's arrival number, head 1 when it
--                                  is first in line, d its new heartbeat
--                                  deadline (server ms; a hand-off message
--                                  names the step it follows by it),
--         {-1, key, type}          when a key holds a value of another type
--                                  (nothing changed).
--#include fence.lua
--#include queue_lib.lua
local lock, counter, q, hb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl, member = ARGV[1], ARGV[2], ARGV[4]
local wttl = tonumber(ARGV[6])

-- The common steps (a join, a heartbeat) make 7 to 10 redis.calls: the
-- types of the queue keys are checked by the first call on each (pcall),
-- before anything is written.
local h = redis.pcall('HMGET', lock, 'owner', 'count', 'fence', 'claim', 'q')
if h['err'] then
  return wrong(lock)
end
local held = h[1] ~= false
if not held and redis.call('EXISTS', lock) == 1 then
  return wrong(lock) -- a hash without an owner: not a lock
end
local flagged = h[5] ~= false -- the lock has the field q
if held and h[1] == token then
  -- Handed over to this waiter: claim it (the lease TTL replaces the
  -- claim TTL). Or the token holds it already: a reentrant owner enters
  -- once more; otherwise this repeats a step whose reply was lost.
  local bad = check_queue(q, hb)
  if bad then
    return bad
  end
  local granted = rehold(lock, ttl, ARGV[3], h[2], h[3], h[4])
  redis.call('ZREM', q, member)
  redis.call('ZREM', hb, member)
  return granted
end

local now_us, now_ms = now()
if not held and redis.call('EXISTS', q) == 0 then
  -- Free and nobody queued: take it.
  return take(lock, counter, token, ttl, now_us)
end

-- Join the queue, or keep the place: a waiter dropped for a late heartbeat
-- comes back at its own arrival number.
local seq = redis.pcall('ZSCORE', q, member)
if type(seq) == 'table' and seq['err'] then
  return wrong(q)
end
local first -- whether this waiter is first in line, when known without a read
local join = false
if seq then
  seq = tonumber(seq)
else
  join = true
  seq = tonumber(ARGV[5]) or 0
  if seq <= 0 then
    local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
    seq = (tonumber(last[2]) or 0) + 1
    first = last[1] == nil
  end
end
local deadline = now_ms + wttl
local added = redis.pcall('ZADD', hb, fmt(deadline), member)
if type(added) == 'table' and added['err'] then
  return wrong(hb)
end
if join then
  redis.call('ZADD', q, fmt(seq), member)
end
if held and not flagged then
  -- Its release must look at the queue (see fence.lua).
  redis.call('HSET', lock, 'q', 1)
end
redis.call('PEXPIRE', q, 2 * wttl)
redis.call('PEXPIRE', hb, 2 * wttl)

local pttl = -1
if not held then
  -- Free, with waiters queued (the lock expired, or a hand-off was never
  -- claimed): serve the first live one, which may be this waiter.
  local head, fence, err = hand_off(lock, counter, q, hb, member, ttl, ARGV[7], ARGV[8], now_us, now_ms)
  if err then
    return err
  end
  if head == member then
    return {1, fence, 1}
  end
  pttl = tonumber(ARGV[7])
  first = nil
end
if first == nil then
  first = redis.call('ZRANGE', q, 0, 0)[1] == member
end
if first then
  if held then
    pttl = redis.call('PTTL', lock)
  end
  return {0, pttl, seq, 1, deadline}
end
return {0, pttl, seq, 0, deadline}
