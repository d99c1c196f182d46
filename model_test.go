package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/memlock"
)

// lateLimit is a backend whose session, and so its MaxTTL, is known only
// after New (zklock right after Connect).
type lateLimit struct {
	*memlock.Backend
	max atomic.Int64
}

func (l *lateLimit) MaxTTL() time.Duration { return time.Duration(l.max.Load()) }

func TestTTLLimiterReadAtAcquire(t *testing.T) {
	b := &lateLimit{Backend: memlock.New()}
	c := dlock.New(b)
	defer c.Close()
	b.max.Store(int64(4 * time.Second)) // the session is established after New
	l := locktest.MustAcquire(t, context.Background(), c, "k")
	defer l.Release(context.Background())
	if l.TTL() != 4*time.Second {
		t.Fatalf("TTL: got %v, want the backend's maximum 4s", l.TTL())
	}
}

type floored struct{ *memlock.Backend }

func (floored) MinTTL() time.Duration { return 20 * time.Millisecond }

func TestTTLFloor(t *testing.T) {
	ctx := context.Background()
	if err := dlock.New(floored{memlock.New()}, dlock.WithTTL(time.Millisecond)).Err(); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("New with a TTL below the floor: got %v, want ErrInvalidTTL", err)
	}
	c := dlock.New(floored{memlock.New()})
	defer c.Close()
	if _, err := c.Acquire(ctx, "k", dlock.WithTTL(5*time.Millisecond)); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("Acquire below the floor: got %v, want ErrInvalidTTL", err)
	}
	l := locktest.MustAcquire(t, ctx, c, "k")
	defer l.Release(ctx)
	if err := l.Refresh(ctx, 5*time.Millisecond); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("Refresh below the floor: got %v, want ErrInvalidTTL", err)
	}
	if l.Err() != nil {
		t.Fatalf("a refused Refresh ended the lease: %v", l.Err())
	}
}

// TestRefreshShorterRenewsSooner: in virtual time, a Refresh to a shorter
// TTL makes the watchdog renew on the shorter period, and the lock stays
// held well past the first deadline.
func TestRefreshShorterRenewsSooner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &counting{Backend: memlock.New()}
		c := dlock.New(b, dlock.WithTTL(3*time.Second))
		defer c.Close()
		ctx := context.Background()
		l := locktest.MustAcquire(t, ctx, c, "k")
		if err := l.Refresh(ctx, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		before := b.renewed.Load()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if err := l.Err(); err != nil {
			t.Fatalf("lease ended: %v", err)
		}
		// Every 100ms over 10s: about 100 renewals; the old 1s period would give 10.
		if n := b.renewed.Load() - before; n < 90 {
			t.Fatalf("renewals in 10s after Refresh(300ms): got %d, want ≥ 90", n)
		}
		if _, err := dlock.New(b.Store().Backend()).TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("another owner: got %v, want ErrNotAcquired", err)
		}
		l.Release(ctx)
	})
}

// TestReentryKeepsDeadline: in virtual time, a re-entry with a shorter
// TTL and its release leave the outer hold's deadline in place.
func TestReentryKeepsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memlock.NewStore()
		c := dlock.New(store.Backend(), dlock.WithOwner("job-1"), dlock.WithAutoRenew(false))
		defer c.Close()
		ctx := context.Background()
		outer := locktest.MustAcquire(t, ctx, c, "k", dlock.WithTTL(2*time.Second))
		inner := locktest.MustAcquire(t, ctx, c, "k", dlock.WithTTL(300*time.Millisecond))
		if inner.Count() != 2 || inner.Fence() != outer.Fence() {
			t.Fatalf("re-entry: count %d fence %d, want 2 and %d", inner.Count(), inner.Fence(), outer.Fence())
		}
		inner.Release(ctx)
		time.Sleep(400 * time.Millisecond)
		other := dlock.New(store.Backend())
		defer other.Close()
		if _, err := other.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("another owner 400ms after the short re-entry's release: got %v, want ErrNotAcquired", err)
		}
		if outer.Err() != nil {
			t.Fatalf("outer hold: %v", outer.Err())
		}
		outer.Release(ctx)
	})
}

// TestSharedOwnerRounds: goroutines of one Client sharing an owner id
// take a free lock at once, round after round: never a lost lease, one
// fence per round, and the lock is free after the last release.
func TestSharedOwnerRounds(t *testing.T) {
	store := memlock.NewStore()
	c := dlock.New(store.Backend(), dlock.WithOwner("job-1"))
	defer c.Close()
	other := dlock.New(store.Backend())
	defer other.Close()
	ctx := context.Background()
	for round := 0; round < 500; round++ {
		var wg sync.WaitGroup
		leases := make([]*dlock.Lease, 2)
		errs := make([]error, 2)
		for i := range leases {
			wg.Add(1)
			go func() { defer wg.Done(); leases[i], errs[i] = c.Acquire(ctx, "k") }()
		}
		wg.Wait()
		for i := range leases {
			if errs[i] != nil {
				t.Fatalf("round %d: %v", round, errs[i])
			}
		}
		if leases[0].Fence() != leases[1].Fence() {
			t.Fatalf("round %d: fences %d and %d", round, leases[0].Fence(), leases[1].Fence())
		}
		for _, l := range leases {
			if err := l.Release(ctx); err != nil {
				t.Fatalf("round %d: Release: %v", round, err)
			}
		}
		l, err := other.TryAcquire(ctx, "k")
		if err != nil {
			t.Fatalf("round %d: lock not free after both releases: %v", round, err)
		}
		l.Release(ctx)
	}
}

// TestTryAcquireWhileOwnerWaits: a TryAcquire by an owner whose other
// goroutine waits for the lock fails at once instead of queuing behind it.
func TestTryAcquireWhileOwnerWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memlock.NewStore()
		holder := dlock.New(store.Backend())
		defer holder.Close()
		ctx := context.Background()
		h := locktest.MustAcquire(t, ctx, holder, "k")
		c := dlock.New(store.Backend(), dlock.WithOwner("job-1"))
		defer c.Close()
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := c.Acquire(wctx, "k"); done <- err }()
		synctest.Wait() // the first goroutine is waiting
		if _, err := c.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("TryAcquire while the owner waits: got %v, want ErrNotAcquired", err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled wait: got %v", err)
		}
		h.Release(ctx)
	})
}

// gatedRelease holds every Release until gate is closed, and reports its
// start on started.
type gatedRelease struct {
	*memlock.Backend
	started chan struct{}
	gate    chan struct{}
}

func (g *gatedRelease) Release(ctx context.Context, r dlock.Request) error {
	select {
	case g.started <- struct{}{}:
	default:
	}
	<-g.gate
	return g.Backend.Release(ctx, r)
}

// TestCloseEndsLeasesFirst: Close ends a lease (Done, contexts) before
// the server frees its lock, so no other owner holds it while the lease
// still looks valid.
func TestCloseEndsLeasesFirst(t *testing.T) {
	store := memlock.NewStore()
	b := &gatedRelease{Backend: store.Backend(), started: make(chan struct{}, 1), gate: make(chan struct{})}
	c := dlock.New(b)
	ctx := context.Background()
	l := locktest.MustAcquire(t, ctx, c, "k")
	work, cancel := l.Context(ctx)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	<-b.started // the server release is under way
	select {
	case <-l.Done():
	default:
		t.Fatal("the server release began while the lease's Done was still open")
	}
	if !errors.Is(context.Cause(work), dlock.ErrClosed) || !errors.Is(l.Err(), dlock.ErrReleased) {
		t.Fatalf("lease after Close: Err %v, context cause %v; want ErrReleased and ErrClosed", l.Err(), context.Cause(work))
	}
	close(b.gate)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	other := dlock.New(store.Backend())
	defer other.Close()
	l2, err := other.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("lock still held after Close: %v", err)
	}
	l2.Release(ctx)
}

// TestConcurrentReleasesGiveBackOneShare: two holds of one owner in one
// Client released at once give the server hold back once, so another
// Client sharing the owner id keeps its own share.
func TestConcurrentReleasesGiveBackOneShare(t *testing.T) {
	store := memlock.NewStore()
	a := dlock.New(store.Backend(), dlock.WithOwner("job-1"))
	b := dlock.New(store.Backend(), dlock.WithOwner("job-1"))
	other := dlock.New(store.Backend())
	defer a.Close()
	defer b.Close()
	defer other.Close()
	ctx := context.Background()
	for round := 0; round < 300; round++ {
		h1 := locktest.MustAcquire(t, ctx, a, "k")
		h2 := locktest.MustAcquire(t, ctx, a, "k")
		hb, err := b.Acquire(ctx, "k") // a share of its own on the server
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, h := range []*dlock.Lease{h1, h2} {
			wg.Add(1)
			go func() { defer wg.Done(); h.Release(ctx) }()
		}
		wg.Wait()
		if l, err := other.TryAcquire(ctx, "k"); err == nil {
			l.Release(ctx)
			t.Fatalf("round %d: another owner took the lock while the second Client's hold lives", round)
		}
		if err := hb.Release(ctx); err != nil {
			t.Fatalf("round %d: second Client's Release: %v", round, err)
		}
	}
}
