-- queue_lib.lua: the FIFO queue's functions, shared by the scripts that
-- serve or change the queue. Scripts include it (a line
-- "--#include queue_lib.lua", see scripts.go) after lib.lua and after
-- their fast path.
--
-- The queue of lock L is the sorted set q (L .. ":q"): members are a
-- waiter's Backend id (IDLEN bytes) .. its token, scores its arrival
-- (server µs). Each waiter's heartbeat is a string L .. ":w:" .. member
-- holding its heartbeat deadline (server ms), which expires at that
-- deadline: a member without one is dead.

local IDLEN = 26

-- beat returns the name of member's heartbeat key.
local function beat(lock, member)
  return lock .. ':w:' .. member
end

-- tell tells the Backend of waiter head (a member) on its wake channel
-- (prefix wake) that lock, fence f, is handed to token: the payload
-- "FENCE DEADLINE CLAIM #lock:lock .. token" (parseWake), with d the
-- waiter's heartbeat deadline and claim ms.
local function tell(wake, head, lock, token, f, d, claim)
  redis.call('PUBLISH', wake .. string.sub(head, 1, IDLEN),
    string.format('%d %s %s %d:%s%s', f, d, claim, #lock, lock, token))
end

-- hand_off serves the first live waiter of a free lock whose last fence
-- was last (0: unknown), at server time t (µs). Dead waiters ahead of it
-- are dropped. If that waiter is self (a member), the lock is granted to
-- it outright (count 1, TTL ttl ms); otherwise it is reserved for it (flag
-- c, TTL claim ms) and its Backend is told (tell). The lock gets flag q.
-- Returns the member served and its fence; nil when nobody waits; or nil,
-- nil and a wrong-type reply (nothing changed).
local function hand_off(lock, q, self, ttl, claim, wake, t, last)
  while true do
    local m = redis.pcall('ZPOPMIN', q)
    if m['err'] then
      return nil, nil, wrong(q)
    end
    local head = m[1]
    if not head then
      return nil
    end
    local d = redis.call('GETDEL', beat(lock, head))
    if d then
      local f = math.max(t, last + 1)
      local token = string.sub(head, IDLEN + 1)
      if head == self then
        redis.call('SET', lock, pack(f, 1, 'q', ahead(f, t), token), 'PX', ttl)
      else
        redis.call('SET', lock, pack(f, 1, 'qc', ahead(f, t), token), 'PX', claim)
        tell(wake, head, lock, token, f, d, claim)
      end
      return head, f
    end
  end
end

-- free_lock frees a lock (fence f, ahead a, flags fl) whose last hold was
-- given up, at server time t (µs; nil: read when needed): with flag q it
-- goes to the first live FIFO waiter (with keep_w, a read-hold marker
-- keeps flag w there, so that its release wakes the readers that found
-- the key held); else it is deleted (or left as a tombstone, see free),
-- with a PUBLISH on rel when it has flag w. Returns nil, or a wrong-type
-- reply (nothing changed).
local function free_lock(lock, q, f, a, fl, claim, wake, rel, t, keep_w)
  if has(fl, 'q') then
    t = t or now()
    local head, hf, err = hand_off(lock, q, nil, 0, claim, wake, t, f)
    if err then
      return err
    end
    if head then
      if keep_w and has(fl, 'w') then
        redis.call('SET', lock, pack(hf, 1, 'qcw', ahead(hf, t), string.sub(head, IDLEN + 1)), 'KEEPTTL')
      end
      return nil
    end
  end
  free(lock, f, a)
  if has(fl, 'w') then
    redis.call('PUBLISH', rel, '')
  end
  return nil
end
