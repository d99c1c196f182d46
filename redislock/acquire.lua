-- acquire.lua: one attempt to take a lock (see lib.lua and doc.go).
--
-- KEYS[1]  the lock
-- ARGV[1]  the owner token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  "1" when the request is reentrant
-- ARGV[4]  a floor for a fresh grant's fence ("" for none)
--
-- Returns {1, fence, count[, now]} when the token holds the lock now
--                           (now: the server time in µs, for a fresh grant),
--         {0, pttl, readers} when another token holds it (pttl -1: no
--                           TTL; readers 1 when read holds hold it),
--         {-1, key, type}   when the key holds a value of another type;
--                           nothing is changed then.
--
-- The common case, a free lock, makes two redis.calls: TIME and
-- SET NX PX GET, which takes the lock or returns what holds it.
--#include lib.lua
local lock, token, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local t = now()
local f = math.max(t, tonumber(ARGV[4]) or 0)
local a = ahead(f, t)
local old = redis.pcall('SET', lock, pack(f, 1, '', a, token), 'NX', 'PX', ttl, 'GET')
if not old then
  return {1, f, 1, t}
end
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
