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
--                                  lock's remaining TTL (-1: none), seq the
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

local bad = check_queue(q, hb)
if bad then
  return bad
end
local pttl = redis.call('PTTL', lock) -- -2: no such key
local flagged = false -- the lock has the field q
if pttl ~= -2 then
  local h = redis.pcall('HMGET', lock, 'owner', 'count', 'fence', 'claim', 'q')
  if h['err'] or not h[1] then
    return wrong(lock)
  end
  flagged = h[5] ~= false
  if h[1] == token then
    -- Handed over to this waiter: claim it (the lease TTL replaces the
    -- claim TTL). Or the token holds it already: a reentrant owner enters
    -- once more; otherwise this repeats a step whose reply was lost.
    local granted = rehold(lock, ttl, ARGV[3], h[2], h[3], h[4])
    redis.call('ZREM', q, member)
    redis.call('ZREM', hb, member)
    return granted
  end
end

local now_us, now_ms = now()
if pttl == -2 and redis.call('EXISTS', q) == 0 then
  -- Free and nobody queued: take it.
  return take(lock, counter, token, ttl, now_us)
end

-- Join the queue, or keep the place: a waiter dropped for a late heartbeat
-- comes back at its own arrival number.
local seq = redis.call('ZSCORE', q, member)
if seq then
  seq = tonumber(seq)
else
  seq = tonumber(ARGV[5]) or 0
  if seq <= 0 then
    local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
    seq = (tonumber(last[2]) or 0) + 1
  end
  redis.call('ZADD', q, fmt(seq), member)
end
local deadline = now_ms + wttl
redis.call('ZADD', hb, fmt(deadline), member)
if pttl ~= -2 and not flagged then
  -- Its release must look at the queue (see fence.lua).
  redis.call('HSET', lock, 'q', 1)
end
redis.call('PEXPIRE', q, 2 * wttl)
redis.call('PEXPIRE', hb, 2 * wttl)

if pttl == -2 then
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
end
local first = redis.call('ZRANGE', q, 0, 0)[1]
if first == member then
  return {0, pttl, seq, 1, deadline}
end
return {0, pttl, seq, 0, deadline}
