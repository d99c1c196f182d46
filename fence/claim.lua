-- Fenced read: read the register and claim it for the reader's token, so
-- that a holder with an older token can no longer write it (a fence
-- checked only on the write does not protect a read-modify-write: the old
-- holder could write between the new holder's read and write).
-- KEYS[1] = the value hash: v = value, f = fence and e = epoch of the
-- highest token accepted (no e: epoch 0), o = its owner.
-- ARGV = fence, owner, epoch.
-- Accept as order.lua's admit says. Returns {1, value or ""} when
-- accepted, {0, highest fence, its epoch} (decimal strings) when
-- rejected, and {-1, what the key holds} when it is not a value hash
-- (order.lua's load); only an accepted claim changes anything.
local cur, reply = admit(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if not cur then
  return reply
end
redis.call('HSET', KEYS[1], 'f', ARGV[1], 'o', ARGV[2], 'e', ARGV[3])
return {1, cur[1] or ''}
