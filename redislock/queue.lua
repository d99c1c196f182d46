-- queue.lua: one step of a FIFO wait (Backend.Wait): take the lock,
-- confirm it when a release handed it over, or join the queue / stay in
-- it (the heartbeat).
--
-- KEYS[1]  the lock, KEYS[2] the FIFO queue
-- ARGV[1]  the owner token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  "1" when the request is reentrant
-- ARGV[4]  the waiter's queue member (Backend id .. token)
-- ARGV[5]  the waiter's arrival (server µs), "0" for a new waiter
-- ARGV[6]  the waiter TTL in milliseconds: the heartbeat deadline is now
--          plus this
-- ARGV[7]  the claim TTL in milliseconds, ARGV[8] the wake channel prefix
--
-- Returns {1, fence, count}        when the token holds the lock now (the
--                                  waiter left the queue),
--         {0, -1, seq, 0, d}       when the waiter is queued: seq is its
--                                  arrival, d its new heartbeat deadline
--                                  (server ms; a hand-off message names
--                                  the step it follows by it),
--         {-1, key, type}          when a key holds a value of another type
--                                  (nothing changed).
--
-- A first step on a free lock makes two redis.calls (TIME, SET NX PX GET),
-- as acquire.lua; like it, it does not read the queue. A join or
-- heartbeat behind a held lock makes five or six: TIME, SET NX GET (a
-- first step) or GET, ZADD NX, SET of the heartbeat, PEXPIRE of the queue,
-- and the lock's flag q when it lacks it.
--#include lib.lua
local lock, q = KEYS[1], KEYS[2]
local token, ttl, member = ARGV[1], ARGV[2], ARGV[4]
local wttl = tonumber(ARGV[6])
local now_us = now()
local old
if ARGV[5] == '0' then
  -- A first step takes a free lock as acquire.lua does.
  old = redis.pcall('SET', lock, pack(now_us, 1, '', 0, token), 'NX', 'PX', ttl, 'GET')
  if not old then
    return {1, now_us, 1}
  end
else
  old = redis.pcall('GET', lock)
end
--#include queue_lib.lua
local state, f, n, fl, a, t = decode(lock, old)
if state == 'wrong' then
  return f
end
local held = state == 'legacy' or (state == 'lock' and n > 0)
if held and t == token then
  local g = rehold(lock, ttl, ARGV[3], f, n, fl, a, t)
  if g[1] == 1 then
    redis.pcall('ZREM', q, member)
    redis.call('DEL', beat(lock, member))
    return g
  end
end
local last = 0
if state == 'lock' then
  last = f
end
if not held and redis.call('EXISTS', q) == 0 then
  -- Free and nobody queued: take it.
  local nf = math.max(now_us, last + 1)
  redis.call('SET', lock, pack(nf, 1, '', ahead(nf, now_us), token), 'PX', ttl)
  redis.call('DEL', beat(lock, member))
  return {1, nf, 1}
end

-- Join the queue, or keep the place: a waiter dropped for a late heartbeat
-- comes back at its own arrival.
local seq = tonumber(ARGV[5]) or 0
if seq <= 0 then
  seq = now_us
end
local added = redis.pcall('ZADD', q, 'NX', fmt(seq), member)
if type(added) == 'table' and added['err'] then
  return wrong(q)
end
local deadline = math.floor(now_us / 1000) + wttl
redis.call('SET', beat(lock, member), fmt(deadline), 'PX', ARGV[6])
redis.call('PEXPIRE', q, fmt(2 * wttl))
if state == 'lock' and n > 0 and not has(fl, 'q') then
  -- Its release must look at the queue.
  redis.call('SET', lock, pack(f, n, fl .. 'q', a, t), 'KEEPTTL')
end
if not held then
  -- Free, with waiters queued (the lock expired, or a hand-off was never
  -- confirmed): serve the first live one, which may be this waiter.
  local head, hf, err = hand_off(lock, q, member, ttl, ARGV[7], ARGV[8], now_us, last)
  if err then
    return err
  end
  if head == member then
    return {1, hf, 1}
  end
end
return {0, -1, seq, 0, deadline}
