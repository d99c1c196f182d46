-- Fenced set. KEYS[1] = value hash: v = value, f = fence and e = epoch of
-- the highest token accepted (no e: epoch 0), o = its owner.
-- ARGV = value, fence, owner, epoch.
-- Accept when (epoch, fence) > highest, or == highest from the same owner.
-- Returns {1, fence, epoch} when written, {0, highest fence, its epoch}
-- when rejected. tonumber is exact up to 2^53, far above the fences dlock
-- issues (server TIME in µs is about 2^51 in 2026) and the epochs used.
local cur = redis.call('HMGET', KEYS[1], 'f', 'o', 'e')
local highest = tonumber(cur[1] or '0')
local hepoch = tonumber(cur[3] or '0')
local fence = tonumber(ARGV[2])
local epoch = tonumber(ARGV[4])
local older = epoch < hepoch or (epoch == hepoch and fence < highest)
local same = epoch == hepoch and fence == highest
if older or (same and cur[1] and cur[2] ~= ARGV[3]) then
  return {0, highest, hepoch}
end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'f', ARGV[2], 'o', ARGV[3], 'e', ARGV[4])
return {1, fence, epoch}
