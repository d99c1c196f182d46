package redislock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// TestReplicasNoReplicas uses WithReplicas on a server without replicas:
// every way of acquiring fails with a clear error matching
// ErrNotReplicated (not ErrNotAcquired: the lock was free) after the WAIT
// timeout, and leaves no lock behind.
func TestReplicasNoReplicas(t *testing.T) {
	const wait = 100 * time.Millisecond
	rdb := newRDB(t, srv.Addr())
	b := newBackend(t, rdb)
	c := peerWith(t, redislock.WithReplicas(1, wait))
	ctx := ctxT(t, 10*time.Second)
	check := func(t *testing.T, err error, took time.Duration, keys ...string) {
		t.Helper()
		if !errors.Is(err, redislock.ErrNotReplicated) || errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("got %v, want an error matching ErrNotReplicated and not ErrNotAcquired", err)
		}
		if !strings.Contains(err.Error(), "replica") || !strings.HasPrefix(err.Error(), "dlock: ") {
			t.Fatalf("error %q: want a dlock error that names the replicas", err)
		}
		if took < wait {
			t.Fatalf("failed after %v, before the WAIT timeout %v", took, wait)
		}
		noLock(t, rdb, b, "after the refusal", keys...)
		t.Logf("%v after %v", err, took)
	}
	t.Run("Acquire", func(t *testing.T) {
		k := key(t)
		start := time.Now()
		_, err := c.Acquire(ctx, k)
		check(t, err, time.Since(start), k)
	})
	t.Run("FIFO", func(t *testing.T) {
		k := key(t)
		start := time.Now()
		_, err := c.Acquire(ctx, k, dlock.WithFIFO())
		check(t, err, time.Since(start), k)
		if q := queueLen(t, rdb, b, k); q != 0 {
			t.Fatalf("queue: got %d entries, want 0", q)
		}
	})
	t.Run("AcquireMany", func(t *testing.T) {
		keys := []string{key(t), key(t), key(t)}
		start := time.Now()
		_, err := c.AcquireMany(ctx, keys)
		check(t, err, time.Since(start), keys...)
	})
	t.Run("Reentrant", func(t *testing.T) {
		k := key(t)
		start := time.Now()
		_, err := c.Acquire(ctx, k, dlock.WithOwner("job"))
		check(t, err, time.Since(start), k)
	})
}

// TestReplicasOptions checks WithReplicas' validation.
func TestReplicasOptions(t *testing.T) {
	rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.ReadTimeout = time.Second })
	for name, opt := range map[string]redislock.Option{
		"ZeroReplicas":       redislock.WithReplicas(0, time.Millisecond),
		"NegativeReplicas":   redislock.WithReplicas(-1, time.Millisecond),
		"ZeroTimeout":        redislock.WithReplicas(1, 0),
		"SubMillisecond":     redislock.WithReplicas(1, time.Microsecond),
		"TimeoutReadTimeout": redislock.WithReplicas(1, time.Second),
		"ZeroWaiterTTL":      redislock.WithWaiterTTL(0),
		"ShortWaiterTTL":     redislock.WithWaiterTTL(time.Millisecond),
	} {
		t.Run(name, func(t *testing.T) {
			b := redislock.New(rdb, opt)
			if err := b.Err(); !errors.Is(err, dlock.ErrInvalidOption) || !strings.HasPrefix(err.Error(), "redislock: ") {
				t.Fatalf("Err: got %v, want a redislock error matching ErrInvalidOption", err)
			}
		})
	}
	if err := redislock.New(rdb, redislock.WithReplicas(1, 999*time.Millisecond)).Err(); err != nil {
		t.Fatalf("WithReplicas(1, 999ms) with ReadTimeout 1s: %v", err)
	}
}

// TestReplicasUnreachable: with WithReplicas, a script whose pipeline
// failed on the connection (go-redis gave up without retrying) reports the
// connection's error, not an empty reply.
func TestReplicasUnreachable(t *testing.T) {
	addr := freeAddr(t)
	rdb := newRDB(t, addr, func(o *redis.Options) { o.MaxRetries = -1 })
	b := redislock.New(rdb, redislock.WithReplicas(1, 100*time.Millisecond))
	t.Cleanup(func() { b.Close() })
	ctx := ctxT(t, 10*time.Second)
	r := dlock.Request{Key: key(t), Token: "tok", TTL: time.Second}
	_, err := b.TryAcquire(ctx, r)
	if err == nil || strings.Contains(err.Error(), "unexpected reply") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("TryAcquire on %s: got %v, want the connection's error naming the address", addr, err)
	}
	r.Fence = 1
	if err := b.Release(ctx, r); err == nil || strings.Contains(err.Error(), "unexpected reply") {
		t.Fatalf("Release on %s: got %v, want the connection's error", addr, err)
	}
}
