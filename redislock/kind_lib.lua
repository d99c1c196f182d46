-- kind_lib.lua: the functions of the permit and read-hold scripts
-- (kind_*.lua). Scripts include it after lib.lua; the functions that
-- serve the queue are in kind_queue_lib.lua.
--
-- While a key has permit or read holds, its lock holds a marker: a lock
-- value with an empty token (no owner token is empty, so the lock scripts
-- see a lock held by someone else), flag p (permits) or r (read holds),
-- COUNT the semaphore's number of permits (1 for read holds) and FENCE the
-- highest fence issued to the holds when it ran ahead of the server clock
-- (else the first hold's). Its TTL covers every hold's deadline.
--
-- The holds are the sorted set H (lock .. ":h"): member FENCE ":" TOKEN,
-- score the hold's deadline (server ms). A member whose deadline passed is
-- dead: the scripts ignore it, and drop it when they count the holds. H
-- lives at least as long as its live holds and is deleted with the last
-- one; a new marker starts a new H (an earlier one's holds are void).
--
-- Permit waiters queue in PQ (lock .. ":pq"), flag s on the marker: see
-- kind_queue.lua.
--
-- A writer that will retry (Request.Waiting) while readers hold leaves a
-- claim in X (lock .. ":x"): member its token, score the claim's deadline
-- (server ms); the marker gets flag x. X counts only under flag x: the
-- claim that sets the flag starts a new X. A queued writer (flag q, a live
-- waiter in the lock's queue) keeps new readers out too.

-- marker_kind returns 'p' or 'r' for a marker (flags fl, token t), nil
-- for a lock.
local function marker_kind(fl, t)
  if t ~= '' then
    return nil
  end
  if has(fl, 'p') then
    return 'p'
  elseif has(fl, 'r') then
    return 'r'
  end
  return nil
end

-- extend sets key's TTL to max(TTL, ttl ms), and to ttl when it has none
-- (GT treats a key without a TTL as one that never expires).
local function extend(key, ttl)
  if redis.call('PEXPIRE', key, ttl, 'GT') == 0 then
    redis.call('PEXPIRE', key, ttl, 'NX')
  end
end

-- member returns the holds' member of token's hold of fence f.
local function member(f, token)
  return fmt(f) .. ':' .. token
end

-- find returns the live member of token's hold in hs (fence fence, or any
-- when fence is '') at server time ms, or nil.
local function find(hs, token, fence, ms)
  if fence ~= '' then
    local m = fence .. ':' .. token
    local s = redis.call('ZSCORE', hs, m)
    if s and tonumber(s) > ms then
      return m
    end
    return nil
  end
  local all = redis.call('ZRANGE', hs, '(' .. fmt(ms), '+inf', 'BYSCORE')
  local suffix = ':' .. token
  for _, m in ipairs(all) do
    if string.sub(m, -#suffix) == suffix and string.find(m, ':', 1, true) == #m - #suffix + 1 then
      return m
    end
  end
  return nil
end

-- flag adds letter c to the flags of lock (fence f, count n, flags fl,
-- ahead a, token t) when missing, keeping its TTL.
local function flag(lock, f, n, fl, a, t, c)
  if not has(fl, c) then
    redis.call('SET', lock, pack(f, n, fl .. c, a, t), 'KEEPTTL')
  end
end
