-- Fenced set. KEYS[1] = value hash: v = value, f = fence and e = epoch of
-- the highest token accepted (no e: epoch 0), o = its owner.
-- ARGV = value, fence, owner, epoch.
-- Accept as order.lua's accepts says. Returns {1, fence, epoch} when
-- written, {0, highest fence, its epoch} when rejected (decimal strings).
local cur = redis.call('HMGET', KEYS[1], 'f', 'o', 'e')
if not accepts(ARGV[2], ARGV[3], ARGV[4], cur[1], cur[2], cur[3]) then
  return {0, cur[1] or '0', cur[3] or '0'}
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'f', ARGV[2], 'o', ARGV[3], 'e', ARGV[4])
return {1, ARGV[2], ARGV[4]}
