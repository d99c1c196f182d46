-- writeback.lua: make one node agree with the fence a Redlock acquisition
-- settled on (the maximum over its quorum), after redislock's acquire.lua
-- granted the lock on that node under the attempt's token.
--
-- KEYS[1]  the lock hash (redislock's layout: owner, count, fence[, wait])
-- KEYS[2]  the fence counter (a string: the last fence this node issued)
-- ARGV[1]  the attempt's token, the owner the node granted the lock to
-- ARGV[2]  the lease's token, the owner the lease refreshes and releases as
-- ARGV[3]  the fence the acquisition settled on
--
-- The counter becomes max(counter, ARGV[3]) whoever holds the lock, so a
-- later acquisition on this node issues a higher fence. If the attempt's
-- token still holds the lock, its owner becomes the lease's token and its
-- fence ARGV[3], so that redislock's refresh.lua and release.lua (which
-- compare both) and Inspect agree with the lease.
--
-- Returns 1 when the attempt's token held the lock (now the lease's),
--         0 when it did not (only the counter was raised),
--         {-1, key, type} when a key holds a value of another type;
--                         nothing is changed then.
local lock, counter = KEYS[1], KEYS[2]
local from, to, fence = ARGV[1], ARGV[2], ARGV[3]

local last = redis.pcall('GET', counter)
if type(last) == 'table' and last['err'] then
  return {-1, counter, redis.call('TYPE', counter)['ok']}
end
local owner = redis.pcall('HGET', lock, 'owner')
if type(owner) == 'table' and owner['err'] then
  return {-1, lock, redis.call('TYPE', lock)['ok']}
end
last = tonumber(last)
if not last or last < tonumber(fence) then
  redis.call('SET', counter, fence)
end
if owner ~= from then
  return 0
end
redis.call('HSET', lock, 'owner', to, 'fence', fence)
return 1
