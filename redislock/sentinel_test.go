package redislock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestSentinel runs the backend on a real Sentinel deployment (one
// primary, one replica, three sentinels) through go-redis' failover
// client: the conformance suite (with FIFO), WithReplicas refusing an
// acquisition the paused replica could not acknowledge, and a failover
// (see sentinelFailover).
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
	newFC := func(t *testing.T) *redis.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:    s.MasterName(),
			SentinelAddrs: s.SentinelAddrs(),
		})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	t.Run("Conformance", func(t *testing.T) {
		dlocktest.Run(t, dlocktest.Harness{
			NewBackend: func(t *testing.T) dlock.Backend { return redislock.New(newFC(t)) },
			TTL:        500 * time.Millisecond,
			FIFO:       true,
		})
	})
	t.Run("Replicas", func(t *testing.T) { sentinelReplicas(t, s, newFC) })
	t.Run("Failover", func(t *testing.T) { sentinelFailover(t, s, newFC) })
}

// sentinelReplicas: with WithReplicas(1, 300ms) an acquisition succeeds
// while the replica is live; with the replica paused (SIGSTOP) WAIT times
// out, the acquisition fails with ErrNotReplicated and the lock is not
// left behind; resumed, acquisitions succeed again.
func sentinelReplicas(t *testing.T, s *testserver.Sentinel, newFC func(*testing.T) *redis.Client) {
	const wait = 300 * time.Millisecond
	rdb := newFC(t)
	b := newBackend(t, rdb)
	c := dlockClient(t, newFC(t), redislock.WithReplicas(1, wait))
	ctx := ctxT(t, time.Minute)
	k := key(t)
	for _, fifo := range []bool{false, true} {
		var opts []dlock.Option
		if fifo {
			opts = append(opts, dlock.WithFIFO())
		}
		l, err := c.Acquire(ctx, k, opts...)
		if err != nil {
			t.Fatalf("Acquire (FIFO %v) with a live replica: %v", fifo, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Replica().Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := s.Replica().Resume(); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer resume()
	for _, fifo := range []bool{false, true} {
		var opts []dlock.Option
		if fifo {
			opts = append(opts, dlock.WithFIFO())
		}
		start := time.Now()
		_, err := c.Acquire(ctx, k, opts...)
		took := time.Since(start)
		if !errors.Is(err, redislock.ErrNotReplicated) {
			t.Fatalf("Acquire (FIFO %v) with the replica paused: got %v, want ErrNotReplicated", fifo, err)
		}
		t.Logf("replica paused: %v after %v", err, took)
		if took < wait {
			t.Fatalf("failed after %v, before the WAIT timeout %v", took, wait)
		}
		if n := rdb.Exists(ctx, b.LockName(k)).Val(); n != 0 {
			t.Fatalf("lock left behind on the primary: EXISTS got %d, want 0", n)
		}
	}
	resume()
	waitFor(t, 20*time.Second, "acquisitions replicated again", func() bool {
		l, err := c.TryAcquire(ctx, k)
		if err != nil {
			return false
		}
		return l.Release(ctx) == nil
	})
}

// sentinelFailover takes locks through a go-redis failover client, kills
// the primary, and takes the lock again on the promoted replica: the fence
// still increases (it is at least the server time in µs), waiters are
// woken by notification on both primaries, and FIFO workers that run
// throughout keep acquiring after the promotion.
func sentinelFailover(t *testing.T, s *testserver.Sentinel, newFC func(*testing.T) *redis.Client) {
	c := newClient(t, newFC(t), dlock.WithTTL(2*time.Second))
	waiter := newClient(t, newFC(t), dlock.WithWait(dlock.Constant(10*time.Second)))
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
		// Let the waiter find the lock held (and queue).
		waitFor(t, 10*time.Second, "the waiter to queue", func() bool {
			addr, err := s.MasterAddr(ctx)
			if err != nil {
				return false
			}
			admin := redis.NewClient(&redis.Options{Addr: addr})
			defer admin.Close()
			return admin.ZCard(ctx, "dlock:{"+k+"}:q").Val() > 0
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

	// FIFO workers on another key, running through the failover.
	const workers = 4
	var (
		promoted atomic.Bool
		acquired [workers]atomic.Int64 // acquisitions after the promotion
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	fk := key(t)
	for w := 0; w < workers; w++ {
		wc := newClient(t, newFC(t), dlock.WithTTL(2*time.Second), dlock.WithFIFO())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				l, err := wc.Acquire(actx, fk)
				cancel()
				if err != nil {
					continue // the failover: errors until the client finds the new primary
				}
				time.Sleep(time.Millisecond)
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err = l.Release(rctx)
				cancel()
				if err == nil && promoted.Load() {
					acquired[w].Add(1)
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

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
	promoted.Store(true)
	promotedAt := time.Now()
	waitFor(t, 30*time.Second, "every FIFO worker acquiring on the new primary", func() bool {
		for w := range acquired {
			if acquired[w].Load() < 5 {
				return false
			}
		}
		return true
	})
	t.Logf("all %d FIFO workers acquired 5 times on the new primary within %v of the promotion", workers, time.Since(promotedAt).Round(time.Millisecond))
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
