package redislock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// TestSentinel takes locks through a go-redis failover client on a real
// Sentinel deployment, kills the primary, and takes the lock again on the
// promoted replica: the fence still increases (it is at least the server
// time in µs), and waiters are woken by notification on both primaries.
func TestSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment and waits for a failover")
	}
	s, err := testserver.StartSentinel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	failover := func() *redis.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:    s.MasterName(),
			SentinelAddrs: s.SentinelAddrs(),
		})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	c := newClient(t, failover(), dlock.WithTTL(2*time.Second))
	waiter := newClient(t, failover(), dlock.WithWait(dlock.Constant(10*time.Second)))
	ctx := ctxT(t, time.Minute)
	k := key(t)

	wokenAfterRelease := func(stage string) uint64 {
		t.Helper()
		l, err := c.Acquire(ctx, k)
		if err != nil {
			t.Fatalf("%s: Acquire: %v", stage, err)
		}
		got := make(chan *dlock.Lease, 1)
		errc := make(chan error, 1)
		go func() {
			w, err := waiter.Acquire(ctx, k)
			if err != nil {
				errc <- err
				return
			}
			got <- w
		}()
		// Let the waiter find the lock held (and subscribe).
		waitFor(t, 10*time.Second, "the waiter to subscribe", func() bool {
			addr, err := s.MasterAddr(ctx)
			if err != nil {
				return false
			}
			admin := redis.NewClient(&redis.Options{Addr: addr})
			defer admin.Close()
			m := admin.PubSubNumSub(ctx, "dlock:{"+k+"}:rel").Val()
			return m["dlock:{"+k+"}:rel"] > 0
		})
		released := time.Now()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("%s: Release: %v", stage, err)
		}
		select {
		case w := <-got:
			if d := time.Since(released); d > time.Second {
				t.Fatalf("%s: waiter acquired %v after the release, want promptly", stage, d)
			}
			if w.Fence() <= l.Fence() {
				t.Fatalf("%s: waiter's fence %d, want > %d", stage, w.Fence(), l.Fence())
			}
			if err := w.Release(ctx); err != nil {
				t.Fatal(err)
			}
			return w.Fence()
		case err := <-errc:
			t.Fatalf("%s: waiter: %v", stage, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: waiter not woken within 5s of the release", stage)
		}
		return 0
	}
	before := wokenAfterRelease("before the failover")

	old, err := s.MasterAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Primary().Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the sentinels to promote the replica", func() bool {
		addr, err := s.MasterAddr(ctx)
		return err == nil && addr != old
	})
	// The failover client finds the new primary by itself.
	waitFor(t, 30*time.Second, "a lock on the new primary", func() bool {
		l, err := c.TryAcquire(ctx, k+".probe")
		if err != nil {
			return false
		}
		l.Release(ctx)
		return true
	})
	after := wokenAfterRelease("after the failover")
	if after <= before {
		t.Fatalf("fence after the failover: got %d, want > %d", after, before)
	}
}
