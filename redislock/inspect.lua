-- inspect.lua: read a lock's state; with ARGV[1] == "1", also delete it
-- whoever holds it (an administrator's forced release).
--
-- KEYS[1]  the lock hash, KEYS[2] the fence counter, KEYS[3] the FIFO
--          queue, KEYS[4] its heartbeats
-- ARGV[1]  "1" to delete the lock
-- ARGV[2]  the release channel, PUBLISHed on when the lock is deleted and
--          no FIFO waiter takes it over
-- ARGV[3]  the claim TTL in milliseconds, ARGV[4] the wake channel prefix
--
-- Returns {0, waiters}                            when nobody holds the lock,
--         {1, owner, count, fence, pttl, waiters} when someone does,
--         {-1, key, type}                         when a key holds a value
--                                                 of another type (left
--                                                 intact).
-- waiters counts the live FIFO waiters (heartbeat deadline not passed).
--#include fence.lua
--#include queue_lib.lua
local lock, counter, q, hb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bad = check_queue(q, hb)
if bad then
  return bad
end
local now_us, now_ms = now()
local waiters = redis.call('ZCOUNT', hb, fmt(now_ms), '+inf')
local kind = redis.call('TYPE', lock)['ok']
if kind == 'none' then
  return {0, waiters}
end
if kind ~= 'hash' then
  return {-1, lock, kind}
end
local h = redis.call('HMGET', lock, 'owner', 'count', 'fence')
if not h[1] then
  return {-1, lock, 'hash'}
end
local pttl = redis.call('PTTL', lock)
if ARGV[1] == '1' then
  redis.call('DEL', lock)
  local head, _, err = hand_off(lock, counter, q, hb, nil, 0, ARGV[3], ARGV[4], now_us, now_ms)
  if err then
    return err
  end
  if not head then
    redis.call('PUBLISH', ARGV[2], h[3] or '')
  end
end
return {1, h[1], tonumber(h[2]) or 1, tonumber(h[3]) or 0, pttl, waiters}
