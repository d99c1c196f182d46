package redislock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/redislock"
)

// TestReentrantClient checks reentrancy by explicit owner through a
// dlock.Client on a real server: depth 3 with one fence and a hold count
// kept in Redis, a different owner waits until the last release, and only
// the last release frees the lock.
func TestReentrantClient(t *testing.T) {
	rdb := newRDB(t, srv.Addr())
	b := newBackend(t, rdb)
	owner := peer(t, dlock.WithOwner("job-42"))
	other := peer(t, dlock.WithOwner("job-43"))
	ctx := ctxT(t, 30*time.Second)
	k := key(t)

	var leases []*dlock.Lease
	for depth := 1; depth <= 3; depth++ {
		waitOpt, waited := locktest.Waiting()
		l, err := owner.Acquire(ctx, k, waitOpt)
		if err != nil {
			t.Fatalf("depth %d: %v", depth, err)
		}
		select {
		case <-waited:
			t.Fatalf("depth %d: the acquisition waited, want a re-entry at once", depth)
		default:
		}
		if l.Count() != depth || l.Fence() != leases0(leases, l).Fence() {
			t.Fatalf("depth %d: got count %d fence %d, want count %d fence %d", depth, l.Count(), l.Fence(), depth, leases0(leases, l).Fence())
		}
		leases = append(leases, l)
		info, err := b.Inspect(ctx, k)
		// Holds of one Client are counted by the Client: the server has one.
		if err != nil || info.Owner != "job-42" || info.Count != 1 || info.Fence != l.Fence() {
			t.Fatalf("depth %d: the server has %+v, %v, want owner job-42, count 1, fence %d", depth, info, err, l.Fence())
		}
	}

	// A different owner waits: here until its deadline...
	short := ctxT(t, 200*time.Millisecond)
	if _, err := other.Acquire(short, k); !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire by another owner while held: got %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	// ... and here until the last release.
	w := startAcquire(other, ctx, k)
	for i := len(leases) - 1; i >= 0; i-- {
		select {
		case l := <-w.got:
			t.Fatalf("the other owner acquired (fence %d) with %d holds left", l.Fence(), i+1)
		case err := <-w.errc:
			t.Fatal(err)
		default:
		}
		if err := leases[i].Release(ctx); err != nil {
			t.Fatalf("release at depth %d: %v", i+1, err)
		}
		if i > 0 {
			if info, err := b.Inspect(ctx, k); err != nil || info.Count != 1 || info.Owner != "job-42" {
				t.Fatalf("after releasing depth %d: the server has %+v, %v, want count 1", i+1, info, err)
			}
		}
	}
	l := w.lease(t, 5*time.Second, "the other owner after the last release")
	if l.Fence() <= leases[0].Fence() || l.Count() != 1 {
		t.Fatalf("other owner: got fence %d count %d, want fence > %d and count 1", l.Fence(), l.Count(), leases[0].Fence())
	}
	release(t, ctx, l)
}

func leases0(ls []*dlock.Lease, l *dlock.Lease) *dlock.Lease {
	if len(ls) == 0 {
		return l
	}
	return ls[0]
}

// TestReentryAfterLoss: re-entering a lock whose earlier hold by the same
// owner was lost fails with ErrLost, never silently re-acquires, whether
// the Client had noticed the loss (its renewal failed) or not (the server
// grants a first hold where the Client expected a nested one).
func TestReentryAfterLoss(t *testing.T) {
	_, b, ctx := onSrv(t)

	t.Run("Noticed", func(t *testing.T) {
		k := key(t)
		c := peer(t, dlock.WithOwner("job-noticed"), dlock.WithTTL(300*time.Millisecond))
		l := mustAcquire(t, ctx, c, k)
		if _, err := b.ForceRelease(ctx, k); err != nil {
			t.Fatal(err)
		}
		notified(t, l.Done(), "the lease's loss after ForceRelease")
		_, err := c.Acquire(ctx, k)
		if !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("re-entry after the loss was noticed: got %v, want ErrLost", err)
		}
		if info, err := b.Inspect(ctx, k); err != nil || info.Held {
			t.Fatalf("lock after the refused re-entry: got %+v, %v, want free", info, err)
		}
		// Once the lost lease is released (acknowledged), the owner may take
		// the lock afresh.
		if err := l.Release(ctx); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("Release of the lost lease: got %v, want ErrLost", err)
		}
		l2, err := c.Acquire(ctx, k)
		if err != nil {
			t.Fatalf("Acquire after acknowledging the loss: %v", err)
		}
		if l2.Count() != 1 || l2.Fence() <= l.Fence() {
			t.Fatalf("fresh acquisition: got count %d fence %d, want 1 and > %d", l2.Count(), l2.Fence(), l.Fence())
		}
		release(t, ctx, l2)
	})
	t.Run("NotNoticed", func(t *testing.T) {
		k := key(t)
		// TTL 1m: no renewal (which would notice) during the test.
		c := peer(t, dlock.WithOwner("job-unnoticed"), dlock.WithTTL(time.Minute))
		l := mustAcquire(t, ctx, c, k)
		if _, err := b.ForceRelease(ctx, k); err != nil {
			t.Fatal(err)
		}
		_, err := c.Acquire(ctx, k)
		if !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("re-entry after an unnoticed loss: got %v, want ErrLost", err)
		}
		if !errors.Is(l.Err(), dlock.ErrLost) {
			t.Fatalf("the earlier hold: Err got %v, want ErrLost", l.Err())
		}
		if info, err := b.Inspect(ctx, k); err != nil || info.Held {
			t.Fatalf("lock after the refused re-entry: got %+v, %v, want free (the accidental grant given back)", info, err)
		}
	})
}

// TestEmptyOwner: WithOwner("") is bad input, on the Client and per call.
func TestEmptyOwner(t *testing.T) {
	rdb := newRDB(t, srv.Addr())
	c := dlock.New(redislock.New(rdb), dlock.WithOwner(""))
	t.Cleanup(func() { c.Close() })
	if err := c.Err(); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("dlock.New with WithOwner(\"\"): Err got %v, want ErrInvalidOption", err)
	}
	ctx := ctxT(t, 5*time.Second)
	k := key(t)
	good := newClient(t, rdb)
	_, err := good.Acquire(ctx, k, dlock.WithOwner(""))
	if !errors.Is(err, dlock.ErrInvalidOption) || !strings.HasPrefix(err.Error(), "dlock: ") {
		t.Fatalf("Acquire with WithOwner(\"\"): got %v, want a dlock error matching ErrInvalidOption", err)
	}
	if n := rdb.Exists(ctx, redislock.New(rdb).LockName(k)).Val(); n != 0 {
		t.Fatalf("lock after the refused Acquire: EXISTS got %d, want 0", n)
	}
}
