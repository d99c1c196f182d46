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
--           is freed (see free_lock); a permit's release PUBLISHes on
--           the release channel when someone found the semaphore full,
--         0 when the token does not hold it (nothing changed),
--         {-1, key, type} when the key holds a value of another type.
--
-- The common case, the last hold given up (by fence) of a marker nobody
-- queued for, makes four redis.calls (GET, TIME, ZRANGE, DEL) and runs
-- before the libraries are included (creating their functions costs as
-- much server time as a redis.call).
local lock, hs = KEYS[1], KEYS[2]
local v = redis.pcall('GET', lock)
local now_us, ms, m, first
if type(v) == 'string' and ARGV[2] ~= '' then
  local _, n, fl, a, t = string.match(v, '^(%d+):(%d+):(%a*):(%d+):(.*)$')
  if t == '' and n ~= '0' and string.find(fl, ARGV[3], 1, true) then
    -- A marker of this kind (lib.lua's decode, kind_lib.lua's
    -- marker_kind). The first two live holds (by deadline) tell whether
    -- this one is live and whether another one is: one call where ZSCORE
    -- and ZCOUNT take two.
    local clock = redis.call('TIME')
    now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    ms = math.floor(now_us / 1000)
    m = ARGV[2] .. ':' .. ARGV[1]
    first = redis.call('ZRANGE', hs, '(' .. string.format('%d', ms), '+inf', 'BYSCORE', 'LIMIT', 0, 2)
    if first[1] == m and not first[2] and a == '0' and not string.find(fl, '[qs]') then
      -- One DEL for the marker, the holds (this one included) and the
      -- claims.
      redis.call('DEL', lock, hs, KEYS[4])
      if string.find(fl, 'w', 1, true) then
        redis.call('PUBLISH', ARGV[4], '')
      end
      return 1
    end
  end
end
--#include lib.lua
--#include kind_lib.lua
local state, f, n, fl, a, t = decode(lock, v)
if state == 'wrong' then
  return f
end
if state ~= 'lock' or n == 0 or marker_kind(fl, t) ~= ARGV[3] then
  return 0
end
if not now_us then
  now_us = now()
  ms = math.floor(now_us / 1000)
end
local live
if ARGV[2] ~= '' then
  m = ARGV[2] .. ':' .. ARGV[1]
  if not first then
    first = redis.call('ZRANGE', hs, '(' .. fmt(ms), '+inf', 'BYSCORE', 'LIMIT', 0, 2)
  end
  if first[1] == m or first[2] == m then
    live = #first - 1
  else
    local s = redis.call('ZSCORE', hs, m)
    if not s or tonumber(s) <= ms then
      return 0
    end
    live = #first
  end
else
  m = find(hs, ARGV[1], '', ms)
  if not m then
    return 0
  end
  live = redis.call('ZCOUNT', hs, '(' .. fmt(ms), '+inf') - 1
end
if live == 0 and a == 0 and not has(fl, 'q') and not has(fl, 's') then
  redis.call('DEL', lock, hs, KEYS[4])
  if has(fl, 'w') then
    redis.call('PUBLISH', ARGV[4], '')
  end
  return 1
end
redis.call('ZREM', hs, m)
--#include queue_lib.lua
--#include kind_queue_lib.lua
if ARGV[3] == 'p' and has(fl, 's') and hand_permit(lock, hs, KEYS[5], f, n, fl, a, now_us, ARGV[5], ARGV[6]) then
  return 1
end
if live == 0 then
  -- The last live hold is gone: the key may go to a queued writer.
  redis.call('DEL', hs, KEYS[4])
  local err = free_lock(lock, KEYS[3], f, a, fl, ARGV[5], ARGV[6], ARGV[4], now_us, true)
  if err then
    return err
  end
  return 1
end
if ARGV[3] == 'r' then
  -- The marker keeps writers out only as long as the longest live hold
  -- (the holds' set may outlive it: a new marker starts a new one).
  local last = redis.call('ZRANGE', hs, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', lock, last[2])
elseif has(fl, 'w') then
  redis.call('PUBLISH', ARGV[4], '')
end
return 1
