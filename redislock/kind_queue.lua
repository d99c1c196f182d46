-- kind_queue.lua: one step of a permit waiter (Backend.Wait for a
-- permit): confirm a permit a release handed to this waiter, or join the
-- semaphore's queue / keep the place (the heartbeat).
--
-- KEYS[1]  the lock, KEYS[2] the holds, KEYS[3] the permit queue
-- ARGV[1]  the owner token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  the waiter's queue member (Backend id .. token)
-- ARGV[4]  the waiter's arrival (server µs), "0" for a new waiter
-- ARGV[5]  the waiter TTL in milliseconds: the heartbeat deadline is now
--          plus this
-- ARGV[6]  the semaphore's number of permits
--
-- The permit queue of lock L is the sorted set L .. ":pq" (members and
-- scores as the lock's queue, see queue_lib.lua), with the same heartbeat
-- keys; the marker's flag s tells a permit's release to look at it.
--
-- Returns {1, fence, 1}        when a release handed this waiter a permit:
--                              it is confirmed with the lease TTL, and the
--                              waiter has left the queue,
--         {0, -1, seq, turn, d} when the waiter is queued: seq is its
--                              arrival, d its heartbeat deadline (server
--                              ms), turn 1 when it is the first live
--                              waiter and a permit may be free (it tries
--                              kind_acquire.lua then),
--         {-1, key, type}      when a key holds a value of another type,
--         {-3, permits}        when the semaphore's live holders use another
--                              number of permits (nothing changed).
--#include lib.lua
--#include kind_lib.lua
local lock, hs, sq = KEYS[1], KEYS[2], KEYS[3]
local token, ttl, mem = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local wttl = tonumber(ARGV[5])
local t = now()
local ms = math.floor(t / 1000)
local beat = lock .. ':w:' .. mem
local state, f, n, fl, a, ot = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
local k
if state == 'lock' and n > 0 then
  k = marker_kind(fl, ot)
end
if k == 'p' and n ~= tonumber(ARGV[6]) and redis.call('ZCOUNT', hs, '(' .. fmt(ms), '+inf') > 0 then
  return {-3, n}
end
if k == 'p' then
  local m = find(hs, token, '', ms)
  if m then
    -- Handed over by a release: confirmed now, with the lease TTL.
    redis.call('ZADD', hs, 'XX', 'GT', ms + ttl, m)
    redis.call('PEXPIRE', hs, ttl, 'GT')
    redis.call('PEXPIRE', lock, ttl, 'GT')
    redis.pcall('ZREM', sq, mem)
    redis.call('DEL', beat)
    return {1, tonumber(string.match(m, '^(%d+):')), 1}
  end
end

-- Join the queue, or keep the place: a waiter dropped for a late heartbeat
-- comes back at its own arrival.
local seq = tonumber(ARGV[4]) or 0
if seq <= 0 then
  seq = t
end
local added = redis.pcall('ZADD', sq, 'NX', fmt(seq), mem)
if type(added) == 'table' and added['err'] then
  return wrong(sq)
end
local deadline = ms + wttl
redis.call('SET', beat, fmt(deadline), 'PX', ARGV[5])
redis.call('PEXPIRE', sq, fmt(2 * wttl))
if k == 'p' then
  flag(lock, f, n, fl, a, ot, 's')
end

-- This waiter's turn: the first live waiter, and a permit may be free.
local turn = 0
while true do
  local head = redis.call('ZRANGE', sq, 0, 0)[1]
  if not head then
    break
  end
  if head == mem then
    if k ~= 'p' then
      turn = 1 -- no semaphore (kind_acquire.lua tells what holds it)
    else
      redis.call('ZREMRANGEBYSCORE', hs, '-inf', ms)
      if redis.call('ZCARD', hs) < n then
        turn = 1
      end
    end
    break
  end
  if redis.call('EXISTS', lock .. ':w:' .. head) == 1 then
    break
  end
  redis.call('ZREM', sq, head) -- a dead waiter
end
return {0, -1, seq, turn, deadline}
