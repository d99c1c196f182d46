// Package fencedfloor holds the least a Redis lock with redislock's
// fencing tokens can run, as a baseline for benchmarks: the lock one
// string "FENCE:1::0:TOKEN" with a TTL, the fence the server time in µs.
// Acquire makes two redis.calls (TIME, SET NX PX GET) and Release two
// (GET, DEL) — what redislock's acquire.lua and release.lua make in the
// common case, without their FIFO queue, reentrancy, tombstones and
// wrong-type handling. Used by redislock's BenchmarkFencedFloor and
// BenchmarkInterleaved and by the bench module's fenced-floor subject; not
// a lock to use.
//
// Minimal is the fence of the earlier layout, kept for comparison
// (redislock's BenchmarkFenceCost): a string lock taken with SET NX PX,
// then max(counter+1, server TIME in µs) from a companion counter key
// (TIME and SET ... GET): three redis.calls. Its fence fragment,
// CounterFence, also serves redislock's rolling-deploy fixture.
//
// RawSemaphore is the floor of a semaphore: the classic sorted-set
// semaphore without leases or fences, used by redislock's permit
// benchmarks and the bench module's K1.
package fencedfloor

import "github.com/redis/go-redis/v9"

// CounterFence is the earlier layout's fence, a Lua fragment: it issues
// the next fence from the permanent counter KEYS[2] into the local now:
// max(last + 1, server time in µs), stored back in the counter (TIME,
// SET ... GET, and a second SET only when the clock is behind it).
const CounterFence = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('SET', KEYS[2], string.format('%d', now), 'GET'))
if last and last >= now then
  now = last + 1
  redis.call('SET', KEYS[2], string.format('%d', now))
end
`

// AcquireSrc and ReleaseSrc are the sources of Acquire and Release, for
// clients other than go-redis.
const (
	AcquireSrc = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local f = string.format('%d', now)
if redis.call('SET', KEYS[1], f .. ':1::0:' .. ARGV[1], 'NX', 'PX', ARGV[2], 'GET') then
  return {0, redis.call('PTTL', KEYS[1])}
end
return {1, now}`
	ReleaseSrc = `
if redis.call('GET', KEYS[1]) == ARGV[2] .. ':1::0:' .. ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`
)

var (
	// Acquire takes KEYS[1] (the lock) for token ARGV[1] with TTL ARGV[2]
	// ms, fence the server time in µs. It returns {1, fence} when granted,
	// {0, pttl} when the lock is held. (KEYS[2] is not used.)
	Acquire = redis.NewScript(AcquireSrc)
	// Minimal takes the string lock KEYS[1] for token ARGV[1] with TTL
	// ARGV[2] ms (SET NX PX) and issues a fence from the counter KEYS[2]
	// (the earlier layout's). It returns {1, fence} when granted, {0, pttl} when the lock is
	// held. Release it with a compare-and-delete of the token.
	Minimal = redis.NewScript(`
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {0, redis.call('PTTL', KEYS[1])} end` + CounterFence + `return {1, now}`)
	// Release deletes KEYS[1] if token ARGV[1] holds it with fence ARGV[2]:
	// 1 when deleted, 0 when not held.
	Release = redis.NewScript(ReleaseSrc)
	// RawSemaphore takes a permit of the sorted-set semaphore KEYS[1] of
	// ARGV[2] permits for token ARGV[1] with TTL ARGV[3] ms: it drops the
	// expired members and adds the token if fewer than ARGV[2] remain. It
	// returns 1 when granted, 0 when full. Give the permit back with ZREM.
	RawSemaphore = redis.NewScript(`local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[3])), ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)
)
