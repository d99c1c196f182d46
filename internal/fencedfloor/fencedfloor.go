// Package fencedfloor holds the least a Redis lock with redislock's
// fencing tokens can run, as a baseline for benchmarks: the fence
// max(counter+1, server TIME in µs) kept in a companion key, the lock a
// hash {owner, fence} with a TTL. Acquire makes five redis.calls (EXISTS,
// TIME, SET ... GET, HSET, PEXPIRE) and Release two (HMGET, DEL) — what
// redislock's acquire.lua and release.lua make in the common case, without
// their FIFO queue, reentrancy, claim and wrong-type handling. Used by
// redislock's BenchmarkFencedFloor and BenchmarkInterleaved and by the
// bench module's fenced-floor subject; not a lock to use.
//
// Minimal is lower still: the least any script can do that issues the
// fence redislock promises (max(counter+1, server TIME in µs), counter in
// a companion key) — a string lock taken with SET NX PX, then TIME and
// SET ... GET of the counter: three redis.calls. It is used by redislock's
// BenchmarkFenceCost to show what that fence costs by itself.
package fencedfloor

import "github.com/redis/go-redis/v9"

// fence issues the next fence from the counter KEYS[2] into now:
// max(last + 1, server time in µs), stored back in the counter (TIME,
// SET ... GET, and a second SET only when the clock is behind it).
const fence = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('SET', KEYS[2], string.format('%.0f', now), 'GET'))
if last and last >= now then
  now = last + 1
  redis.call('SET', KEYS[2], string.format('%.0f', now))
end
`

var (
	// Acquire takes KEYS[1] (the lock) with KEYS[2] (its fence counter)
	// for token ARGV[1] with TTL ARGV[2] ms. It returns {1, fence} when
	// granted, {0, pttl} when the lock is held.
	Acquire = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, redis.call('PTTL', KEYS[1])} end` + fence + `redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, now}`)
	// Minimal takes the string lock KEYS[1] for token ARGV[1] with TTL
	// ARGV[2] ms (SET NX PX) and issues a fence from KEYS[2] as Acquire
	// does. It returns {1, fence} when granted, {0, pttl} when the lock is
	// held. Release it with a compare-and-delete of the token.
	Minimal = redis.NewScript(`
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0, redis.call('PTTL', KEYS[1])} end` + fence + `return {1, now}`)
	// Release deletes KEYS[1] if token ARGV[1] holds it with fence ARGV[2]:
	// 1 when deleted, 0 when not held.
	Release = redis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if h[1] == ARGV[1] and h[2] == ARGV[2] then return redis.call('DEL', KEYS[1]) end
return 0`)
)
