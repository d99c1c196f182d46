-- kind_queue_lib.lua: the functions of the permit and read-hold scripts
-- that look at the lock's queue. Scripts include it after lib.lua,
-- kind_lib.lua and queue_lib.lua, after their fast path.

-- writer_waits reports whether a writer keeps new readers out of the
-- marker (flags fl) at server time ms: a live claim in x, or a live waiter
-- at the head of the queue q. Dead claims and waiters are dropped.
local function writer_waits(lock, q, x, fl, ms)
  if has(fl, 'x') then
    redis.call('ZREMRANGEBYSCORE', x, '-inf', ms)
    if redis.call('ZCARD', x) > 0 then
      return true
    end
  end
  if has(fl, 'q') then
    while true do
      local head = redis.pcall('ZRANGE', q, 0, 0)
      if head['err'] or not head[1] then
        return false
      end
      if redis.call('EXISTS', beat(lock, head[1])) == 1 then
        return true
      end
      redis.call('ZREM', q, head[1])
    end
  end
  return false
end

-- hand_permit hands a permit just given up on the semaphore lock (marker
-- fence f, count n, flags fl, ahead a) to the first live waiter of its
-- permit queue pq, at server time t (µs): a hold with a new fence,
-- reserved for it for claim ms (its first renewal, or its next step,
-- confirms it with the lease TTL), and a message on its Backend's wake
-- channel, as hand_off's. Dead waiters ahead of it are dropped. Returns
-- the member served, or nil when nobody waits.
local function hand_permit(lock, hs, pq, f, n, fl, a, t, claim, wake)
  local ms = math.floor(t / 1000)
  while true do
    local m = redis.pcall('ZPOPMIN', pq)
    if m['err'] or not m[1] then
      return nil
    end
    local head = m[1]
    local d = redis.call('GETDEL', beat(lock, head))
    if d then
      local nf = math.max(t, f + 1)
      local token = string.sub(head, IDLEN + 1)
      redis.call('ZADD', hs, ms + tonumber(claim), member(nf, token))
      extend(hs, claim)
      redis.call('PEXPIRE', lock, claim, 'GT')
      if nf > t then
        redis.call('SET', lock, pack(nf, n, fl, math.max(a, ahead(nf, t)), ''), 'KEEPTTL')
      end
      tell(wake, head, lock, token, nf, d, claim)
      return head
    end
  end
end
