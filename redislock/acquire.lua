-- acquire.lua: one attempt to take a lock (see doc.go for the key layout).
--
-- KEYS[1]  the lock: a hash {owner, count, fence[, wait]} that expires with
--          the lease
-- KEYS[2]  the fence counter: a string holding the last fence issued, no TTL
-- ARGV[1]  the owner token
-- ARGV[2]  the lease TTL in milliseconds
-- ARGV[3]  "1" when the request is reentrant
--
-- Returns {1, fence, count} when the token holds the lock now,
--         {0, pttl}         when another token holds it (pttl -1: no TTL),
--         {-1, key, type}   when a key holds a value of another type;
--                           nothing is changed then.
--
-- Every redis.call costs about a microsecond of server time (Redis 7.0),
-- so the free path makes five: PTTL, TIME, SET ... GET, HSET, PEXPIRE.
local lock, counter = KEYS[1], KEYS[2]
local token, ttl = ARGV[1], ARGV[2]

local pttl = redis.call('PTTL', lock) -- -2: no such key
if pttl ~= -2 then
  local h = redis.pcall('HMGET', lock, 'owner', 'count', 'fence', 'wait')
  if h['err'] or not h[1] then
    -- Not a hash, or a hash that is not one of ours.
    return {-1, lock, redis.call('TYPE', lock)['ok']}
  end
  if h[1] ~= token then
    -- Held by another token. Mark the lock as waited on, so that its
    -- release is PUBLISHed (uncontended releases publish nothing).
    if not h[4] then
      redis.call('HSET', lock, 'wait', 1)
    end
    return {0, pttl}
  end
  -- The token holds the lock already. Reentrant: one more hold.
  -- Otherwise this repeats an attempt whose reply was lost: grant it again.
  local n = tonumber(h[2]) or 1
  if ARGV[3] == '1' then
    n = redis.call('HINCRBY', lock, 'count', 1)
  end
  redis.call('PEXPIRE', lock, ttl)
  return {1, tonumber(h[3]) or 0, n}
end

-- Free. The fence is max(last + 1, server time in µs): strictly above every
-- fence this counter issued, and above every fence issued before the counter
-- was lost or rolled back (DEL, a restart without persistence, a failover)
-- as long as the server clock does not step back.
local now = redis.call('TIME')
local fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
local f = string.format('%.0f', fence)
local last = redis.pcall('SET', counter, f, 'GET')
if type(last) == 'table' and last['err'] then
  return {-1, counter, redis.call('TYPE', counter)['ok']}
end
last = tonumber(last)
if last and last >= fence then
  fence = last + 1
  f = string.format('%.0f', fence)
  redis.call('SET', counter, f)
end
redis.call('HSET', lock, 'owner', token, 'count', 1, 'fence', f)
redis.call('PEXPIRE', lock, ttl)
return {1, fence, 1}
