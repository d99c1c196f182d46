-- queue_lib.lua: the FIFO queue's functions, shared by the scripts that
-- serve or change the queue. Scripts include it (a line
-- "--#include queue_lib.lua", see scripts.go) after fence.lua and after
-- their fast path. See fence.lua for the key layout.

local IDLEN = 26

-- check_queue returns a wrong-type reply when q or hb hold a value of
-- another type, else nil.
local function check_queue(q, hb)
  for _, k in ipairs({q, hb}) do
    local t = redis.call('TYPE', k)['ok']
    if t ~= 'none' and t ~= 'zset' then
      return wrong(k)
    end
  end
  return nil
end

-- hand_off serves the first live waiter of a free lock: dead waiters (whose
-- heartbeat deadline has passed) ahead of it are dropped. If that waiter is
-- self (a member), the lock is granted to it outright (count 1, TTL ttl);
-- otherwise it is reserved for it (owner = its token, field claim, TTL
-- claim ms) and its Backend is told on wake .. id, with the payload
-- "FENCE DEADLINE CLAIM #lock:lock .. token": the new fence, the waiter's
-- heartbeat deadline (which names the waiter's last step: the hand-off
-- came after it) and the claim TTL, so that the waiter can hold the lock
-- at once, without a claim request (see fifo.go). Either way the lock gets
-- the field q (others may still wait behind it). The served waiter leaves
-- the queue.
-- Returns the member served and its fence; nil when nobody waits; or nil,
-- nil and a wrong-type reply (nothing changed).
local function hand_off(lock, counter, q, hb, self, ttl, claim, wake, now_us, now_ms)
  local dead = redis.pcall('ZRANGEBYSCORE', hb, '-inf', '(' .. fmt(now_ms), 'LIMIT', 0, 64)
  if dead['err'] then
    return nil, nil, wrong(hb)
  end
  local first = redis.pcall('ZRANGE', q, 0, 0)
  if first['err'] then
    return nil, nil, wrong(q)
  end
  if not first[1] then
    -- Nobody queued: drop heartbeats left behind.
    if #dead > 0 then
      redis.call('ZREM', hb, unpack(dead))
    end
    return nil
  end
  -- Someone may be served: the fence first, so that a counter of another
  -- type leaves everything as it was (an unused fence is harmless).
  local fence, err = new_fence(counter, now_us)
  if not fence then
    return nil, nil, err
  end
  local head = first[1]
  if #dead > 0 then
    redis.call('ZREM', q, unpack(dead))
    redis.call('ZREM', hb, unpack(dead))
    head = redis.call('ZRANGE', q, 0, 0)[1]
  end
  while head do
    local d = tonumber(redis.call('ZSCORE', hb, head))
    redis.call('ZREM', q, head)
    redis.call('ZREM', hb, head)
    if d and d >= now_ms then
      local token = string.sub(head, IDLEN + 1)
      if head == self then
        redis.call('HSET', lock, 'owner', token, 'count', 1, 'fence', fmt(fence), 'q', 1)
        redis.call('HDEL', lock, 'claim')
        redis.call('PEXPIRE', lock, ttl)
      else
        redis.call('HSET', lock, 'owner', token, 'count', 1, 'fence', fmt(fence), 'claim', 1, 'q', 1)
        redis.call('PEXPIRE', lock, claim)
        redis.call('PUBLISH', wake .. string.sub(head, 1, IDLEN),
          fmt(fence) .. ' ' .. fmt(d) .. ' ' .. claim .. ' ' .. #lock .. ':' .. lock .. token)
      end
      return head, fence
    end
    head = redis.call('ZRANGE', q, 0, 0)[1]
  end
  return nil
end

-- free_lock frees a lock whose last hold was given up: it goes to the first
-- live FIFO waiter, or else is deleted, with a PUBLISH on rel when an
-- attempt found it held (waited). Returns 1, or a wrong-type reply.
local function free_lock(lock, counter, q, hb, claim, wake, rel, waited)
  if redis.call('EXISTS', q) == 1 then
    local now_us, now_ms = now()
    local head, _, err = hand_off(lock, counter, q, hb, nil, 0, claim, wake, now_us, now_ms)
    if err then
      return err
    end
    if head then
      return 1
    end
  end
  redis.call('DEL', lock)
  if waited then
    redis.call('PUBLISH', rel, '')
  end
  return 1
end
