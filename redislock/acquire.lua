-- acquire.lua: one attempt to take a lock (see lib.lua and doc.go).
--
-- KEYS[1]  the lock
-- ARGV[1]  the owner token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  "1" when the request is reentrant
-- ARGV[4]  a floor for a fresh grant's fence ("" for none)
-- ARGV[5]  "1" when the lock is expected to hold a tombstone (a release
--          of a fence that ran ahead of the clock, just before)
--
-- Returns {1, fence, count[, now]} when the token holds the lock now
--                           (now: the server time in µs, for a fresh grant
--                           that read it),
--         {0, pttl, readers} when another token holds it (pttl -1: no
--                           TTL; readers 1 when read holds hold it),
--         {-1, key, type}   when the key holds a value of another type;
--                           nothing is changed then.
--
-- The common cases come first and create no function of lib.lua: a free
-- lock makes two redis.calls (TIME, and SET NX PX GET, which takes the
-- lock or returns what holds it); an expected tombstone makes two (GET,
-- SET PX) and needs no TIME: its fence, carried over, and the floor are
-- above every earlier fence of the lock (see doc.go, Fencing).
local lock, token, ttl = KEYS[1], ARGV[1], ARGV[2]
local floor = tonumber(ARGV[4]) or 0
local old = 0 -- what the lock holds; 0 until read
if ARGV[5] == '1' then
  old = redis.pcall('GET', lock)
  if type(old) == 'string' then
    local tf, ta = string.match(old, '^(%d+):0::(%d+):$')
    if tf and ta ~= '0' then
      -- AHEAD bounds how far the new fence runs ahead of the clock: the
      -- tombstone's fence ran ahead by less than its AHEAD at its grant.
      -- A bound grown past a second is computed from TIME instead.
      tf = tonumber(tf)
      local f = math.max(floor, tf + 1)
      local a = tonumber(ta) + math.ceil((f - tf) / 1000) + 1
      if a <= 1000 then
        redis.call('SET', lock, string.format('%d:1::%d:%s', f, a, token), 'PX', ttl)
        return {1, f, 1}
      end
    end
  end
end
local tm = redis.call('TIME')
local t = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local f, a = t, 0
if floor > t then
  f, a = floor, math.floor((floor - t) / 1000) + 2
end
if old == 0 then
  old = redis.pcall('SET', lock, string.format('%d:1::%d:%s', f, a, token), 'NX', 'PX', ttl, 'GET')
  if not old then
    return {1, f, 1, t}
  end
elseif not old then
  redis.call('SET', lock, string.format('%d:1::%d:%s', f, a, token), 'PX', ttl)
  return {1, f, 1, t}
end
--#include lib.lua
local state, of, n, fl, oa, ot = decode(lock, old)
if state == 'wrong' then
  return of
elseif state == 'legacy' then
  return {0, redis.call('PTTL', lock)}
end
if n == 0 then
  -- A tombstone: free, and the fence goes above it.
  f = math.max(f, of + 1)
  a = ahead(f, t)
  redis.call('SET', lock, pack(f, 1, '', a, token), 'PX', ttl)
  return {1, f, 1, t}
end
if ot == token then
  return rehold(lock, ttl, ARGV[3], of, n, fl, oa, ot)
end
if not has(fl, 'w') then
  -- Held by another token: its release PUBLISHes from now on.
  redis.call('SET', lock, pack(of, n, fl .. 'w', oa, ot), 'KEEPTTL')
end
-- 1 when read holds hold it (a marker: empty token, flag r), so that a
-- writer that will wait claims it; 0 otherwise.
local readers = 0
if ot == '' and has(fl, 'r') then
  readers = 1
end
return {0, redis.call('PTTL', lock), readers}
