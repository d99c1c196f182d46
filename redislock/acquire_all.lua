-- acquire_all.lua: one attempt to take several locks of one Redis Cluster
-- slot, all or none (Backend.TryAcquireAll).
--
-- KEYS     four per lock, in order: the lock hash, the fence counter, the
--          FIFO queue, its heartbeats
-- ARGV[1]  the claim TTL in milliseconds, ARGV[2] the wake channel prefix
-- ARGV     then three per lock: the owner token, the lease TTL in
--          milliseconds, "1" when reentrant
--
-- Returns {1, fence1, count1, fence2, count2, ...} when every lock is now
--           held by its token (each with its own fence),
--         {0, pttl1, pttl2, ...} when some lock is held by another token
--           (or reserved for a FIFO waiter): nothing was taken; pttl is
--           the holder's remaining TTL for such a lock (-1: no TTL) and
--           -3 for a lock that did not stand in the way,
--         {-1, key, type} when a key holds a value of another type
--           (nothing was taken).
--#include fence.lua
--#include queue_lib.lua
local claim, wake = ARGV[1], ARGV[2]
local n = #KEYS / 4
local now_us, now_ms = now()
local mine, pttls = {}, {}
local blocked = false

for i = 1, n do
  local lock, counter, q, hb = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local token = ARGV[3 * i]
  local bad = check_queue(q, hb)
  if bad then
    return bad
  end
  local t = redis.call('TYPE', counter)['ok']
  if t ~= 'none' and t ~= 'string' then
    return wrong(counter)
  end
  local pttl = redis.call('PTTL', lock)
  pttls[i] = -3
  if pttl ~= -2 then
    local h = redis.pcall('HMGET', lock, 'owner', 'count', 'fence', 'wait', 'claim')
    if h['err'] or not h[1] then
      return wrong(lock)
    end
    if h[1] == token then
      mine[i] = h
    else
      if not h[4] then
        redis.call('HSET', lock, 'wait', 1)
      end
      pttls[i] = pttl
      blocked = true
    end
  elseif redis.call('EXISTS', q) == 1 then
    -- Free with FIFO waiters queued: they come first.
    local head, _, err = hand_off(lock, counter, q, hb, nil, 0, claim, wake, now_us, now_ms)
    if err then
      return err
    end
    if head then
      redis.call('HSET', lock, 'wait', 1)
      pttls[i] = tonumber(claim)
      blocked = true
    end
  end
end

if blocked then
  local out = {0}
  for i = 1, n do
    out[i + 1] = pttls[i]
  end
  return out
end

local out = {1}
for i = 1, n do
  local lock, counter = KEYS[4 * i - 3], KEYS[4 * i - 2]
  local ttl = ARGV[3 * i + 1]
  local h = mine[i]
  local granted
  if h then
    -- Held by this token already: claim, re-enter or grant again.
    granted = rehold(lock, ttl, ARGV[3 * i + 2], h[2], h[3], h[5])
  else
    -- The counters' types were checked above: take cannot fail here.
    granted = take(lock, counter, ARGV[3 * i], ttl, now_us)
  end
  out[2 * i] = granted[2]
  out[2 * i + 1] = granted[3]
end
return out
