-- lib.lua: the functions every script shares. Scripts include it (a line
-- "--#include lib.lua", see scripts.go) ahead of their fast path; the
-- queue functions (queue_lib.lua) come after it, so the common case does
-- not pay for creating them. See doc.go for the key layout.
--
-- A lock's value is one string:
--
--   FENCE ":" COUNT ":" FLAGS ":" AHEAD ":" TOKEN
--
-- FENCE   the grant's fence (server µs, or above: see doc.go)
-- COUNT   the hold count; 0 marks a tombstone (a free lock whose fence
--         later grants must stay above, with no token)
-- FLAGS   letters: w (a TryAcquire found it held: PUBLISH on release),
--         q (FIFO waiters may be queued: a release looks at the queue),
--         c (handed to a FIFO waiter, not yet confirmed)
-- AHEAD   at least how many ms the fence ran ahead of the server clock
--         at the grant, plus one (0: it did not); a release of a lock
--         whose AHEAD is not 0 leaves a tombstone until the server clock
--         passes FENCE instead of DEL
-- TOKEN   the owner token

-- now returns the server time in µs.
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- fmt formats an integral number exactly (tostring would use %.14g, and
-- %.0f costs the server a float conversion).
local function fmt(n)
  return string.format('%d', n)
end

-- wrong is the reply for a key that holds a value of another type.
local function wrong(key)
  return {-1, key, redis.call('TYPE', key)['ok']}
end

-- pack returns a lock value.
local function pack(f, n, fl, a, t)
  return string.format('%d:%d:%s:%d:%s', f, n, fl, a, t)
end

-- has reports whether flags fl contain letter c.
local function has(fl, c)
  return string.find(fl, c, 1, true) ~= nil
end

-- ahead returns how long (ms, rounded up, plus one) fence f runs ahead of
-- the server time t (µs); 0 when it does not.
local function ahead(f, t)
  if f <= t then
    return 0
  end
  return math.floor((f - t) / 1000) + 2
end

-- decode reads the reply v of a GET (pcall) of lock. It returns 'free';
-- 'lock', fence, count, flags, ahead, token (count 0: a tombstone);
-- 'legacy' for a lock written by an earlier version of this package (a
-- hash with an owner: held by someone else); or 'wrong' and the
-- wrong-type reply.
local function decode(lock, v)
  if not v then
    return 'free'
  end
  if type(v) == 'table' then
    if redis.call('TYPE', lock)['ok'] == 'hash' and redis.call('HEXISTS', lock, 'owner') == 1 then
      return 'legacy'
    end
    return 'wrong', wrong(lock)
  end
  local f, n, fl, a, t = string.match(v, '^(%d+):(%d+):(%a*):(%d+):(.*)$')
  if not f then
    return 'wrong', {-1, lock, 'string'}
  end
  return 'lock', tonumber(f), tonumber(n), fl, tonumber(a), t
end

-- holding reads the GET reply v of lock: when token holds it by the grant
-- of fence fa ('' matches any), it returns nil, fence, count, flags,
-- ahead, token; otherwise the script's reply: the wrong-type reply, or 0.
local function holding(lock, v, token, fa)
  local state, f, n, fl, a, t = decode(lock, v)
  if state == 'wrong' then
    return f
  end
  if state ~= 'lock' or n == 0 or t ~= token or (fa ~= '' and fmt(f) ~= fa) then
    return 0
  end
  return nil, f, n, fl, a, t
end

-- free deletes a lock whose last hold was given up, or, when its fence f
-- ran ahead of the server clock at the grant (a > 0), leaves a tombstone
-- of f (with the lock's AHEAD a) until the clock passes f.
local function free(lock, f, a)
  if a > 0 then
    redis.call('SET', lock, pack(f, 0, '', a, ''), 'PXAT', fmt(math.floor(f / 1000)))
  else
    redis.call('DEL', lock)
  end
end

-- rehold answers a request of the token that holds the lock (fence f,
-- count n, flags fl, ahead a): a hand-off not confirmed yet is confirmed
-- (flag c dropped); a reentrant request ("1") adds a hold; any other is
-- not granted (M6). The deadline becomes max(deadline, now + ttl).
-- Returns {1, fence, count}, or {0, pttl}.
local function rehold(lock, ttl, reentrant, f, n, fl, a, t)
  if has(fl, 'c') then
    redis.call('SET', lock, pack(f, n, string.gsub(fl, 'c', ''), a, t), 'KEEPTTL')
  elseif reentrant == '1' then
    n = n + 1
    redis.call('SET', lock, pack(f, n, fl, a, t), 'KEEPTTL')
  else
    return {0, redis.call('PTTL', lock)}
  end
  redis.call('PEXPIRE', lock, ttl, 'GT')
  return {1, f, n}
end
