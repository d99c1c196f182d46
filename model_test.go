package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
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
		assertHeld(t, locktest.Closing(t, dlock.New(b.Store().Backend())), "k", "by another owner")
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
		assertHeld(t, locktest.Closing(t, dlock.New(store.Backend())), "k", "400ms after the short re-entry's release")
		if outer.Err() != nil {
			t.Fatalf("outer hold: %v", outer.Err())
		}
		outer.Release(ctx)
	})
}

// TestMinHold: a lock released within its minimum hold stays held until
// the minimum hold ends, then is free at once.
func TestMinHold(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []dlock.Option
	}{
		{"Renewed", nil},
		{"TTLShorterThanMinHold", []dlock.Option{dlock.WithTTL(200 * time.Millisecond), dlock.WithAutoRenew(false)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				taken := time.Now()
				other := releaseInMinHold(t, time.Second, tc.opts...)
				if d := freedAt(t, other, "job", 2*time.Second).Sub(taken); d != time.Second {
					t.Fatalf("lock released within a 1s minimum hold: free %v after it was taken, want 1s", d)
				}
			})
		})
	}
}

// releaseInMinHold takes "job" through a Client with WithMinHold(d) and
// opts on a new memlock store, releases it at once (checking that the
// lease ended as released), and returns another Client of the store; both
// are closed when the test ends.
func releaseInMinHold(t *testing.T, d time.Duration, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	store := memlock.NewStore()
	c := locktest.Closing(t, dlock.New(store.Backend(), append([]dlock.Option{dlock.WithMinHold(d)}, opts...)...))
	other := locktest.Closing(t, dlock.New(store.Backend()))
	ctx := context.Background()
	l := locktest.MustAcquire(t, ctx, c, "job")
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release within the minimum hold: %v", err)
	}
	if !errors.Is(l.Err(), dlock.ErrReleased) {
		t.Fatalf("lease after Release: got %v, want ErrReleased", l.Err())
	}
	return other
}

// TestMinHoldHuge: a minimum hold as long as a Duration holds keeps the
// lock after Release (its extension's TTL saturates; it overflowed to the
// 1ms floor, freeing the lock at once while Release returned nil).
func TestMinHoldHuge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		other := releaseInMinHold(t, math.MaxInt64)
		time.Sleep(time.Hour)
		assertHeld(t, other, "job", "an hour into an endless minimum hold")
	})
}

// flakyRefresh is a Backend whose next fail Refresh calls fail with a
// network-like error before reaching the store.
type flakyRefresh struct {
	dlock.Backend
	fail atomic.Int32
}

var errUnreachable = errors.New("server unreachable")

func (b *flakyRefresh) Refresh(ctx context.Context, r dlock.Request) error {
	if b.fail.Add(-1) >= 0 {
		return errUnreachable
	}
	return b.Backend.Refresh(ctx, r)
}

// TestMinHoldExtendFails: a Release within the minimum hold whose
// extension fails retries it; when it cannot succeed before the lock's
// current expiry, Release says so and the lock is freed at that expiry.
func TestMinHoldExtendFails(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fails int32
		held  bool          // the lock is held until the minimum hold ends
		freed time.Duration // after the acquisition: the end of the minimum hold, or the expiry of the lock's TTL
	}{
		{"Once", 1, true, 2 * time.Second},
		{"Always", 1 << 30, false, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memlock.NewStore()
				b := &flakyRefresh{Backend: store.Backend()}
				c := locktest.Closing(t, dlock.New(b, dlock.WithMinHold(2*time.Second), dlock.WithTTL(500*time.Millisecond), dlock.WithAutoRenew(false)))
				other := locktest.Closing(t, dlock.New(store.Backend()))
				ctx := context.Background()
				taken := time.Now()
				l := locktest.MustAcquire(t, ctx, c, "job")
				expires := l.Expires()
				b.fail.Store(tc.fails)
				err := l.Release(ctx)
				if tc.held && err != nil {
					t.Fatalf("Release with one failed extension: %v", err)
				}
				if !tc.held && (!errors.Is(err, dlock.ErrMinHold) || !errors.Is(err, errUnreachable)) {
					t.Fatalf("Release with the extension failing: got %v, want ErrMinHold wrapping the failure", err)
				}
				if !errors.Is(l.Err(), dlock.ErrReleased) {
					t.Fatalf("lease after Release: got %v, want ErrReleased", l.Err())
				}
				if left := time.Until(expires); !tc.held && left > 50*time.Millisecond {
					t.Fatalf("Release gave up %v before the lock's expiry", left)
				}
				if d := freedAt(t, other, "job", 3*time.Second).Sub(taken); d != tc.freed {
					t.Fatalf("lock free %v after it was taken, want %v", d, tc.freed)
				}
			})
		})
	}
}

// TestMaxHold: a lease ends as lost at its maximum hold, though renewed,
// and the lock is given back at once.
func TestMaxHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memlock.NewStore()
		c := locktest.Closing(t, dlock.New(store.Backend(), dlock.WithTTL(300*time.Millisecond), dlock.WithMaxHold(time.Second)))
		other := locktest.Closing(t, dlock.New(store.Backend()))
		ctx := context.Background()
		taken := time.Now()
		l := locktest.MustAcquire(t, ctx, c, "job")
		work, cancel := l.Context(ctx)
		defer cancel()
		select {
		case <-l.Done():
		case <-time.After(2 * time.Second):
			t.Fatal("lease not ended 2s into a 1s maximum hold")
		}
		if d := time.Since(taken); d != time.Second {
			t.Fatalf("lease ended %v after it was taken, want at its 1s maximum hold", d)
		}
		if err := l.Err(); !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrMaxHold) {
			t.Fatalf("after the maximum hold: got %v, want ErrLost and ErrMaxHold", err)
		}
		if !errors.Is(context.Cause(work), dlock.ErrMaxHold) {
			t.Fatalf("lease context cause: got %v, want ErrMaxHold", context.Cause(work))
		}
		synctest.Wait() // the lock is given back after the lease ends
		assertFree(t, other, "job", "at the end of the maximum hold")
		if err := l.Release(ctx); !errors.Is(err, dlock.ErrMaxHold) {
			t.Fatalf("Release after the maximum hold: got %v, want ErrMaxHold", err)
		}
	})
}

func TestHoldOptionsInvalid(t *testing.T) {
	for name, opts := range map[string][]dlock.Option{
		"NegativeMin": {dlock.WithMinHold(-time.Second)},
		"NegativeMax": {dlock.WithMaxHold(-time.Second)},
		"MaxBelowMin": {dlock.WithMinHold(2 * time.Second), dlock.WithMaxHold(time.Second)},
	} {
		if err := dlock.New(memlock.New(), opts...).Err(); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Errorf("%s: got %v, want ErrInvalidOption", name, err)
		}
	}
}

// TestReleaseLostReturnsAtOnce: the Release of a lease lost while the
// server does not answer returns without waiting for the server.
func TestReleaseLostReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memlock.NewStore()
		c := dlock.New(store.Backend(), dlock.WithTTL(300*time.Millisecond))
		ctx := context.Background()
		l := locktest.MustAcquire(t, ctx, c, "k")
		store.Pause()
		<-l.Done()
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := l.Release(rctx); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("Release of a lost lease: got %v, want ErrLost", err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("Release of a lost lease waited %v (virtual time) for a frozen server", d)
		}
		store.Resume()
		c.Close()
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
		assertFree(t, other, "k", fmt.Sprintf("in round %d, after both releases", round))
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
	assertFree(t, locktest.Closing(t, dlock.New(store.Backend())), "k", "after Close")
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
		assertHeld(t, other, "k", fmt.Sprintf("in round %d, while the second Client's hold lives", round))
		if err := hb.Release(ctx); err != nil {
			t.Fatalf("round %d: second Client's Release: %v", round, err)
		}
	}
}
