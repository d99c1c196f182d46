-- Fenced set. KEYS[1] = value hash; ARGV = value, fence, owner.
-- Accept when fence > highest, or fence == highest from the same owner.
-- Returns {1, fence} when written, {0, highest} when rejected.
-- tonumber is exact up to 2^53, far above the fences dlock issues
-- (server TIME in µs is about 2^51 in 2026).
local cur = redis.call('HMGET', KEYS[1], 'f', 'o')
local highest = tonumber(cur[1] or '0')
local fence = tonumber(ARGV[2])
if fence < highest or (fence == highest and cur[1] and cur[2] ~= ARGV[3]) then
  return {0, highest}
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'f', ARGV[2], 'o', ARGV[3])
return {1, fence}
