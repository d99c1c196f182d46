package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/fencedfloor"
)

// legacyAcquire is the fast path of the previous version's acquire.lua
// (a fixture: the layout a client of that version writes): the lock a hash
// {owner, count, fence} with the lease's TTL, the fence
// max(counter + 1, server time in µs) in the permanent counter KEYS[2]
// (fencedfloor.CounterFence).
// It returns {1, fence} when it took the lock, {0, pttl} when the lock key
// exists, and a Redis error for a key of another type, as that version
// does (HMGET on a string fails).
var legacyAcquire = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
  local h = redis.call('HMGET', KEYS[1], 'owner')
  return {0, redis.call('PTTL', KEYS[1])}
end` + fencedfloor.CounterFence + `
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'fence', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, now}`)

// TestRollingDeploy: a lock written by the previous version (a hash and
// a fence counter) is never granted to this version while it is held, by
// TryAcquire or by a waiting Acquire; this version's Release, Refresh and
// ForceRelease leave it alone; and the previous version grants nothing
// over a lock of this version. Once the old lock is gone, this version
// takes it with a higher fence.
func TestRollingDeploy(t *testing.T) {
	rdb, b, ctx := onSrv(t)
	k := key(t)
	lock := b.LockName(k)
	old, err := legacyAcquire.Run(ctx, rdb, []string{lock, lock + ":fence"}, "old-client", 60000).Slice()
	if err != nil || old[0] != int64(1) {
		t.Fatalf("legacy acquire: got %v, %v, want a grant", old, err)
	}
	oldFence := uint64(old[1].(int64))

	r := req(k, time.Minute)
	g, err := b.TryAcquire(ctx, r)
	if err != nil || g.OK || g.HolderTTL < 50*time.Second {
		t.Fatalf("TryAcquire of a legacy lock: got %+v, %v, want not granted with HolderTTL ≈ 1m", g, err)
	}
	c := peer(t)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(short, k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("waiting Acquire of a legacy lock: got %v, want ErrNotAcquired after its deadline", err)
	}
	legacy := dlock.Request{Key: k, Token: "old-client", TTL: time.Minute}
	if err := b.Refresh(ctx, legacy); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of a legacy lock: got %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, legacy); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release of a legacy lock: got %v, want ErrNotHeld", err)
	}
	info, err := b.Inspect(ctx, k)
	if err != nil || !info.Held || info.Owner != "old-client" || info.Fence != oldFence {
		t.Fatalf("Inspect of a legacy lock: got %+v, %v, want held by old-client with fence %d", info, err, oldFence)
	}
	if owner := rdb.HGet(ctx, lock, "owner").Val(); owner != "old-client" {
		t.Fatalf("legacy lock after the calls: owner %q, want old-client", owner)
	}

	// The old client releases (its release deleted the hash); this version
	// takes the lock, with a higher fence.
	if err := rdb.Del(ctx, lock).Err(); err != nil {
		t.Fatal(err)
	}
	g = mustGrant(t, b, r)
	if g.Fence <= oldFence {
		t.Fatalf("fence after the legacy lock: got %d, want > %d", g.Fence, oldFence)
	}
	// The previous version grants nothing over it: its HMGET of the
	// string fails.
	if v, err := legacyAcquire.Run(ctx, rdb, []string{lock, lock + ":fence"}, "old-client", 60000).Slice(); !redis.HasErrorPrefix(err, "WRONGTYPE") {
		t.Fatalf("legacy acquire over this version's lock: got %v, %v, want a WRONGTYPE error", v, err)
	}
	if v, _ := readLock(t, rdb, b, k); v.Token != r.Token {
		t.Fatalf("lock after the legacy attempt: %+v, want held by %s", v, r.Token)
	}
	rdb.Del(ctx, lock+":fence")
}
