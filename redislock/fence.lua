-- fence.lua: the functions every script that issues fences needs. Scripts
-- include it (a line "--#include fence.lua", see scripts.go) ahead of their
-- fast path; the queue functions (queue_lib.lua) come after it, so that the
-- common case does not pay for creating them (each local function is a
-- closure made anew on every run, about 0.15 µs of server time each).
--
-- Keys of one lock (all share the hash tag {KEY}, see doc.go):
--   lock     PREFIX{KEY}        hash {owner, count, fence[, wait][, claim][, q]}
--   counter  PREFIX{KEY}:fence  the last fence issued
--   q        PREFIX{KEY}:q      FIFO queue: sorted set, member = the
--                               waiter's Backend id (IDLEN bytes) .. token,
--                               score = arrival number
--   hb       PREFIX{KEY}:hb     heartbeats: sorted set, same members,
--                               score = deadline in server milliseconds
-- A lock handed to a waiter by a release carries the field claim until the
-- waiter claims it (queue.lua); meanwhile its TTL is the short claim TTL.
-- A lock carries the field q while FIFO waiters may be queued behind it
-- (set when one joins, and on every hand-off): a release of a lock without
-- it needs no look at the queue. The invariant: q is non-empty only while
-- the lock is free or carries q.

-- now returns the server time in µs and in ms.
local function now()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000000 + us, s * 1000 + math.floor(us / 1000)
end

-- fmt formats an integral number exactly (tostring would use %.14g).
local function fmt(n)
  return string.format('%.0f', n)
end

-- wrong is the reply for a key that holds a value of another type.
local function wrong(key)
  return {-1, key, redis.call('TYPE', key)['ok']}
end

-- new_fence issues the next fence of a lock: max(last + 1, server time in
-- µs), stored in the counter. Returns the fence, or nil and a wrong-type
-- reply (nothing changed). The fence is strictly above every fence this
-- counter issued, and above every fence issued before the counter was lost
-- or rolled back (DEL, a restart without persistence, a failover) as long
-- as the server clock does not step back.
local function new_fence(counter, now_us)
  local fence = now_us
  local last = redis.pcall('SET', counter, fmt(fence), 'GET')
  if type(last) == 'table' and last['err'] then
    return nil, wrong(counter)
  end
  last = tonumber(last)
  if last and last >= fence then
    fence = last + 1
    redis.call('SET', counter, fmt(fence))
  end
  return fence
end

-- take grants a free lock to token: a new fence, count 1, TTL ttl ms.
-- Returns {1, fence, 1}, or a wrong-type reply (nothing changed).
local function take(lock, counter, token, ttl, now_us)
  local fence, err = new_fence(counter, now_us)
  if not fence then
    return err
  end
  redis.call('HSET', lock, 'owner', token, 'count', 1, 'fence', fmt(fence))
  redis.call('PEXPIRE', lock, ttl)
  return {1, fence, 1}
end

-- rehold renews a lock its token holds already, given the lock's count,
-- fence and claim fields: a hand-off not claimed yet is claimed, a
-- reentrant request ("1") adds a hold, any other repeats a grant whose
-- reply was lost. The lock gets TTL ttl ms. Returns {1, fence, count}.
local function rehold(lock, ttl, reentrant, count, fence, claim)
  local n = tonumber(count) or 1
  if claim then
    redis.call('HDEL', lock, 'claim')
  elseif reentrant == '1' then
    n = redis.call('HINCRBY', lock, 'count', 1)
  end
  redis.call('PEXPIRE', lock, ttl)
  return {1, tonumber(fence) or 0, n}
end
