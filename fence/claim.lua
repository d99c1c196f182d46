-- Fenced read: read the register and claim it for the reader's fence, so
-- that a holder with an older fence can no longer write it (a fence
-- checked only on the write does not protect a read-modify-write: the old
-- holder could write between the new holder's read and write).
-- KEYS[1] = the value hash: v = value, f = highest fence accepted,
-- o = its owner. ARGV = fence, owner.
-- Accept when fence > highest, or fence == highest from the same owner
-- (package fence's rule). Returns {1, value or ""} when accepted, and
-- {0, highest} when rejected.
local cur = redis.call('HMGET', KEYS[1], 'v', 'f', 'o')
local highest = tonumber(cur[2] or '0')
local fence = tonumber(ARGV[1])
if fence < highest or (fence == highest and cur[2] and cur[3] ~= ARGV[2]) then
  return {0, tostring(cur[2])}
end
redis.call('HSET', KEYS[1], 'f', ARGV[1], 'o', ARGV[2])
return {1, cur[1] or ''}
