-- kind_acquire.lua: one attempt to take a permit or a read hold (see
-- kind_lib.lua and doc.go).
--
-- KEYS[1]  the lock, KEYS[2] the holds, KEYS[3] the queue, KEYS[4] the
--          writers' claims, KEYS[5] the permit queue
-- ARGV[1]  the owner token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  the kind: "p" (a permit) or "r" (a read hold)
-- ARGV[4]  the semaphore's number of permits ("1" for a read hold)
-- ARGV[5]  the permit queue member of a waiter whose turn it is, or ""
--          (a grant takes it out of the queue)
--
-- Returns {1, fence, 1, now}  when the hold is granted (now: the server
--                             time in µs),
--         {0, pttl}           when it is not: pttl is how long until a
--                             hold in the way may end (-1: unknown),
--         {-1, key, type}     when the key holds a value of another type,
--         {-2, kind}          when the key is held as another kind
--                             ("lock", "p" or "r"),
--         {-3, permits}       when the semaphore's holders use another
--                             number of permits;
--                             nothing is changed in the last three cases.
--
-- The first hold of a key makes four redis.calls (TIME, SET NX PX GET,
-- ZADD, PEXPIRE NX); a hold next to others seven (TIME, SET NX PX GET,
-- ZREMRANGEBYSCORE, ZCARD, ZADD, PEXPIRE GT of the holds and the lock).
-- The first hold's path runs before the libraries are included: it needs
-- none of their functions, and creating them costs server time.
local lock, hs, q, x = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl, kind, permits = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local clock = redis.call('TIME')
local t = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local ms = math.floor(t / 1000)
local ft = string.format('%d', t)
-- The marker: FENCE:COUNT:FLAGS:AHEAD:TOKEN as lib.lua's pack writes it.
local old = redis.pcall('SET', lock, ft .. ':' .. permits .. ':' .. kind .. ':0:', 'NX', 'PX', ttl, 'GET')
if not old and ARGV[5] == '' then
  -- A new marker. PEXPIRE NX finds a holds' set that has a TTL already,
  -- one an earlier marker left (every set gets its TTL when created): its
  -- holds are void (dead, or deleted behind their holders' backs), so it
  -- starts again, as it does when the key holds another type.
  local m = ft .. ':' .. token
  local added = redis.pcall('ZADD', hs, ms + ttl, m)
  if type(added) == 'table' or redis.call('PEXPIRE', hs, ttl, 'NX') == 0 then
    redis.call('DEL', hs)
    redis.call('ZADD', hs, ms + ttl, m)
    redis.call('PEXPIRE', hs, ttl)
  end
  return {1, t, 1, t}
end
--#include lib.lua
--#include kind_lib.lua

-- grant adds the hold of fence f to the holds (a new set when fresh). A
-- queued waiter leaves the queue, and flags the marker s when others
-- still wait.
local function grant(f, fresh)
  redis.call('ZADD', hs, ms + ttl, member(f, token))
  if fresh then
    redis.call('PEXPIRE', hs, ttl)
  else
    redis.call('PEXPIRE', hs, ttl, 'GT')
  end
  if ARGV[5] ~= '' then
    redis.call('ZREM', KEYS[5], ARGV[5])
    redis.call('DEL', lock .. ':w:' .. ARGV[5])
    if redis.call('EXISTS', KEYS[5]) == 1 then
      local _, mf, mn, mfl, ma, mt = decode(lock, redis.call('GET', lock))
      flag(lock, mf, mn, mfl, ma, mt, 's')
    end
  end
  return {1, f, 1, t}
end

if not old then
  -- A new marker taken by a queued waiter whose turn it is.
  if kind == 'r' then
    redis.call('DEL', hs, x)
  end
  return grant(t, true)
end
--#include queue_lib.lua
--#include kind_queue_lib.lua
local state, f, n, fl, a, ot = decode(lock, old)
if state == 'wrong' then
  return f
elseif state == 'legacy' then
  return {0, redis.call('PTTL', lock)}
end
if n == 0 then
  -- A tombstone: free, and the fence goes above it.
  local nf = math.max(t, f + 1)
  redis.call('SET', lock, pack(nf, permits, kind, ahead(nf, t), ''), 'PX', ttl)
  redis.call('DEL', hs, x)
  return grant(nf, true)
end
local k = marker_kind(fl, ot)
if not k then
  -- Held as a lock.
  if kind == 'p' then
    return {-2, 'lock'}
  end
  flag(lock, f, n, fl, a, ot, 'w')
  return {0, redis.call('PTTL', lock)}
end
redis.call('ZREMRANGEBYSCORE', hs, '-inf', ms)
local live = redis.call('ZCARD', hs)
if live > 0 and k ~= kind then
  return {-2, k}
end
if kind == 'p' and live > 0 and n ~= permits then
  return {-3, n}
end
if kind == 'p' and live >= permits then
  flag(lock, f, n, fl, a, ot, 'w')
  local first = redis.call('ZRANGE', hs, 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - ms}
end
if kind == 'r' and writer_waits(lock, q, x, fl, ms) then
  flag(lock, f, n, fl, a, ot, 'w')
  return {0, -1}
end
local nf = math.max(t, f + 1)
if k ~= kind or n ~= permits or nf > t then
  -- A marker nobody holds any more, taken for another kind or number of
  -- permits; or a fence above the server clock, kept in the marker.
  local nfl = kind
  for _, c in ipairs({'q', 'w'}) do
    if has(fl, c) then
      nfl = nfl .. c
    end
  end
  if kind == 'r' and has(fl, 'x') then
    nfl = nfl .. 'x'
  elseif kind == 'p' and has(fl, 's') then
    nfl = nfl .. 's'
  end
  redis.call('SET', lock, pack(nf, permits, nfl, math.max(a, ahead(nf, t)), ''), 'KEEPTTL')
end
redis.call('PEXPIRE', lock, ttl, 'GT') -- a marker always has a TTL
return grant(nf, live == 0)
