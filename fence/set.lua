-- Fenced set. KEYS[1] = value hash: v = value, f = fence and e = epoch of
-- the highest token accepted (no e: epoch 0), o = its owner.
-- ARGV = value, fence, owner, epoch.
-- Accept as order.lua's admit says. Returns {1, fence, epoch} when
-- written, {0, highest fence, its epoch} when rejected (decimal strings),
-- and {-1, what the key holds} when it is not a value hash (order.lua's
-- load); only an accepted write changes anything.
local cur, reply = admit(KEYS[1], ARGV[2], ARGV[3], ARGV[4])
if not cur then
  return reply
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'f', ARGV[2], 'o', ARGV[3], 'e', ARGV[4])
return {1, ARGV[2], ARGV[4]}
