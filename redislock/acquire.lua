-- acquire.lua: one attempt to take a lock (see fence.lua and doc.go for
-- the key layout).
--
-- KEYS[1]  the lock: a hash {owner, count, fence[, wait][, claim][, q]} that
--          expires with the lease
-- KEYS[2]  the fence counter: a string holding the last fence issued, no TTL
-- KEYS[3]  the FIFO queue, KEYS[4] its heartbeats
-- ARGV[1]  the owner token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  "1" when the request is reentrant
-- ARGV[4]  the claim TTL in milliseconds, ARGV[5] the wake channel prefix
-- ARGV[6]  a floor for a fresh grant's fence ("" for none): the fence is
--          then max(last + 1, server time in µs, floor)
--
-- Returns {1, fence, count} when the token holds the lock now,
--         {0, pttl}         when another token holds it (pttl -1: no TTL),
--         {-1, key, type}   when a key holds a value of another type;
--                           nothing is changed then.
--
-- A free lock with live FIFO waiters goes to the first of them (it is
-- handed over here, as a release would), not to this attempt: FIFO waiters
-- are never overtaken.
--
-- Every redis.call costs about 1–2 µs of server time (Redis 7.0), so the
-- common case, a free lock nobody queues for, makes five: EXISTS (of the
-- lock and the queue at once), TIME, SET ... GET, HSET, PEXPIRE; and the
-- queue functions are not even created for it.
local lock, counter, q, hb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl = ARGV[1], ARGV[2]
local floor = tonumber(ARGV[6]) or 0
--#include fence.lua

if redis.call('EXISTS', lock, q) == 0 then
  -- Free, and nobody queued.
  return take(lock, counter, token, ttl, math.max(now(), floor))
end

local pttl = redis.call('PTTL', lock) -- -2: no such key
if pttl ~= -2 then
  local h = redis.pcall('HMGET', lock, 'owner', 'count', 'fence', 'wait', 'claim')
  if h['err'] or not h[1] then
    -- Not a hash, or a hash that is not one of ours.
    return wrong(lock)
  end
  if h[1] ~= token then
    -- Held by another token. Mark the lock as waited on, so that its
    -- release is PUBLISHed (uncontended releases publish nothing).
    if not h[4] then
      redis.call('HSET', lock, 'wait', 1)
    end
    return {0, pttl}
  end
  -- The token holds the lock already. Handed over to it by a release and
  -- not claimed yet: this claims it. Reentrant: one more hold. Otherwise
  -- this repeats an attempt whose reply was lost: grant it again.
  return rehold(lock, ttl, ARGV[3], h[2], h[3], h[5])
end

-- Free, with FIFO waiters queued (the lock expired under them, or a
-- hand-off was never claimed): the first live one gets it.
--#include queue_lib.lua
local now_us, now_ms = now()
local head, _, err = hand_off(lock, counter, q, hb, nil, ttl, ARGV[4], ARGV[5], now_us, now_ms)
if err then
  return err
end
if head then
  redis.call('HSET', lock, 'wait', 1)
  return {0, tonumber(ARGV[4])}
end
return take(lock, counter, token, ttl, math.max(now_us, floor))
