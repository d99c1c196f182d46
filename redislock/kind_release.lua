-- kind_release.lua: give up a permit or a read hold.
--
-- KEYS[1]  the lock, KEYS[2] the holds, KEYS[3] the queue, KEYS[4] the
--          writers' claims, KEYS[5] the permit queue
-- ARGV[1]  the owner token
-- ARGV[2]  the fence of the hold, or "" to match any
-- ARGV[3]  the kind: "p" or "r"
-- ARGV[4]  the release channel
-- ARGV[5]  the claim TTL in milliseconds, ARGV[6] the wake channel prefix
--
-- Returns 1 when the hold is given up: a permit goes to the first live
--           waiter of the permit queue (flag s, see hand_permit); after
--           the last hold the key goes to the first live queued writer or
--           is freed (see free_marker); a permit's release PUBLISHes on
--           the release channel when someone found the semaphore full,
--         0 when the token does not hold it (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
--#include lib.lua
--#include kind_lib.lua
local lock, hs = KEYS[1], KEYS[2]
local state, f, n, fl, a, t = decode(lock, redis.pcall('GET', lock))
if state == 'wrong' then
  return f
end
if state ~= 'lock' or n == 0 or marker_kind(fl, t) ~= ARGV[3] then
  return 0
end
local now_us = now()
local ms = math.floor(now_us / 1000)
local m = find(hs, ARGV[1], ARGV[2], ms)
if not m then
  return 0
end
redis.call('ZREM', hs, m)
local live = redis.call('ZCOUNT', hs, '(' .. fmt(ms), '+inf')
if live == 0 then
  if a == 0 and not has(fl, 'q') and not has(fl, 's') then
    -- The common case: one DEL for the marker, the holds and the claims.
    redis.call('DEL', lock, hs, KEYS[4])
    if has(fl, 'w') then
      redis.call('PUBLISH', ARGV[4], '')
    end
    return 1
  end
end
--#include queue_lib.lua
--#include kind_queue_lib.lua
if ARGV[3] == 'p' and has(fl, 's') and hand_permit(lock, hs, KEYS[5], f, n, fl, a, now_us, ARGV[5], ARGV[6]) then
  return 1
end
if live == 0 then
  -- The last live hold is gone: the key may go to a queued writer.
  redis.call('DEL', hs, KEYS[4])
  local err = free_marker(lock, KEYS[3], f, a, fl, ARGV[5], ARGV[6], ARGV[4], now_us)
  if err then
    return err
  end
  return 1
end
if ARGV[3] == 'r' then
  -- The marker keeps writers out only as long as the longest live hold
  -- (the holds' set may outlive it: a new marker deletes it).
  local last = redis.call('ZRANGE', hs, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', lock, last[2])
elseif has(fl, 'w') then
  redis.call('PUBLISH', ARGV[4], '')
end
return 1
