-- kind_inspect.lua: read the permit or read holds of a key; with ARGV[1]
-- == "1", also remove them (an administrator's forced release).
--
-- KEYS[1]  the lock, KEYS[2] the holds, KEYS[3] the queue, KEYS[4] the
--          writers' claims, KEYS[5] the permit queue
-- ARGV[1]  "1" to remove the holds
-- ARGV[2]  the release channel
-- ARGV[3]  the claim TTL in milliseconds, ARGV[4] the wake channel prefix
--
-- Returns {0} when the key has no permit or read holds (nothing changed),
--         {1, kind, permits, waiters, now, member1, deadline1, ...} when it
--           has: kind "p" or "r", now and the deadlines in server ms, the
--           members FENCE ":" TOKEN of the live holds; waiters counts the
--           lock's queue and the permit queue.
--#include lib.lua
--#include kind_lib.lua
--#include queue_lib.lua
--#include kind_queue_lib.lua
local lock, hs, q = KEYS[1], KEYS[2], KEYS[3]
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state ~= 'lock' or n == 0 then
  return {0}
end
local k = marker_kind(fl, t)
if not k then
  return {0}
end
local now_us = now()
local ms = math.floor(now_us / 1000)
local holds = redis.call('ZRANGE', hs, '(' .. fmt(ms), '+inf', 'BYSCORE', 'WITHSCORES')
local waiters = 0
for _, key in ipairs({q, KEYS[5]}) do
  local c = redis.pcall('ZCARD', key)
  if type(c) == 'number' then
    waiters = waiters + c
  end
end
if ARGV[1] == '1' then
  redis.call('DEL', hs, KEYS[4])
  local err = free_lock(lock, q, f, a, 'q' .. fl .. 'w', ARGV[3], ARGV[4], ARGV[2], now_us, true)
  if err then
    return err
  end
end
local out = {1, k, n, waiters, ms}
for i, v in ipairs(holds) do
  out[5 + i] = v
end
return out
