package dlocktest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// The cases below check the lease model of the package overview: what
// re-entries, Refresh, cancellations, shared owner ids and Close do to the
// holds of one lock.

func owner() string { return "owner-" + rand.Text()[:8] }

// reentryShorterTTL: a re-entry with a shorter TTL, in the same Client and
// through another Client sharing the owner id, and its release never let
// the lock go before the outer hold's Expires.
func (s *suite) reentryShorterTTL(t *testing.T) {
	key, id := Key(t), owner()
	ctx := locktest.Ctx(t, s.long())
	c := s.client(t)
	outer := locktest.MustAcquire(t, ctx, c, key, dlock.WithOwner(id), dlock.WithTTL(6*s.h.TTL), dlock.WithAutoRenew(false))
	defer outer.Release(context.Background())
	for _, via := range []*dlock.Client{c, s.client(t)} {
		inner, err := via.TryAcquire(ctx, key, dlock.WithOwner(id), dlock.WithTTL(s.h.TTL), dlock.WithAutoRenew(false))
		if err != nil {
			if via != c && errors.Is(err, dlock.ErrNotAcquired) {
				continue // this backend keeps owners per connection
			}
			t.Fatalf("re-entry: %v", err)
		}
		if inner.Fence() != outer.Fence() {
			t.Fatalf("re-entry fence: got %d, want %d", inner.Fence(), outer.Fence())
		}
		release(t, inner)
	}
	time.Sleep(s.h.TTL + s.h.Slack)
	if err := outer.Err(); err != nil {
		t.Fatalf("outer hold ended: %v", err)
	}
	if time.Until(outer.Expires()) < s.h.TTL {
		t.Skip("too slow to check: the outer hold is about to expire")
	}
	s.assertHeld(t, key)
}

// refreshShorterTTL: Refresh to a shorter TTL never moves the deadline or
// Expires back, and the watchdog renews on the new, shorter period.
func (s *suite) refreshShorterTTL(t *testing.T) {
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	l := locktest.MustAcquire(t, ctx, s.client(t), key, dlock.WithTTL(3*s.h.TTL))
	defer release(t, l)
	before := l.Expires()
	if err := l.Refresh(ctx, s.h.TTL); err != nil {
		t.Fatalf("Refresh(%v): %v", s.h.TTL, err)
	}
	if got := l.Expires(); got.Before(before) {
		t.Fatalf("Expires moved back by %v after Refresh to a shorter TTL", before.Sub(got))
	}
	// Past the first deadline and several short periods: still held.
	time.Sleep(time.Until(before) + s.h.TTL)
	if err := l.Err(); err != nil {
		t.Fatalf("lease ended after Refresh to a shorter TTL: %v", err)
	}
	s.assertHeld(t, key)
}

// backendDeadline calls the backend directly: a grant with a long TTL
// followed by a Refresh and a re-entry with a short one keeps the long
// deadline.
func (s *suite) backendDeadline(t *testing.T) {
	s.skipExpiry(t)
	b := s.h.NewBackend(t)
	defer b.Close()
	key, tok := Key(t), owner()
	ctx := locktest.Ctx(t, s.long())
	g, err := b.TryAcquire(ctx, dlock.Request{Key: key, Token: tok, TTL: 6 * s.h.TTL})
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire: %+v, %v", g, err)
	}
	start := time.Now()
	r := dlock.Request{Key: key, Token: tok, TTL: s.h.TTL, Fence: g.Fence}
	if err := b.Refresh(ctx, r); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	rr := dlock.Request{Key: key, Token: tok, TTL: s.h.TTL, Reentrant: true}
	g2, err := b.TryAcquire(ctx, rr)
	if err != nil {
		t.Fatalf("reentrant TryAcquire: %v", err)
	}
	if g2.OK {
		if err := b.Release(ctx, r); err != nil {
			t.Fatalf("Release of the re-entry: %v", err)
		}
	}
	time.Sleep(s.h.TTL + s.h.Slack)
	if time.Since(start) > 5*s.h.TTL {
		t.Skip("too slow to check")
	}
	s.assertHeld(t, key)
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("final Release: %v", err)
	}
}

// backendFence calls the backend directly: Release and Refresh with the
// fence of an earlier grant of the same token change nothing.
func (s *suite) backendFence(t *testing.T) {
	b := s.h.NewBackend(t)
	defer b.Close()
	key, tok := Key(t), owner()
	ctx := locktest.Ctx(t, s.long())
	g1, err := b.TryAcquire(ctx, dlock.Request{Key: key, Token: tok, TTL: s.h.TTL})
	if err != nil || !g1.OK {
		t.Fatalf("TryAcquire: %+v, %v", g1, err)
	}
	if err := b.Release(ctx, dlock.Request{Key: key, Token: tok, TTL: s.h.TTL, Fence: g1.Fence}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	g2, err := b.TryAcquire(ctx, dlock.Request{Key: key, Token: tok, TTL: 4 * s.h.TTL})
	if err != nil || !g2.OK {
		t.Fatalf("second TryAcquire: %+v, %v", g2, err)
	}
	if g2.Fence <= g1.Fence {
		t.Fatalf("second grant's fence: got %d, want > %d", g2.Fence, g1.Fence)
	}
	stale := dlock.Request{Key: key, Token: tok, TTL: s.h.TTL, Fence: g1.Fence}
	if err := b.Refresh(ctx, stale); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh with an earlier grant's fence: got %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, stale); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release with an earlier grant's fence: got %v, want ErrNotHeld", err)
	}
	s.assertHeld(t, key)
	if err := b.Release(ctx, dlock.Request{Key: key, Token: tok, TTL: s.h.TTL, Fence: g2.Fence}); err != nil {
		t.Fatalf("Release of the current grant: %v", err)
	}
}

// sharedOwner: goroutines of one Client sharing an owner id take a free
// lock at once: all hold it with one fence, none is lost, and the last
// release frees it.
func (s *suite) sharedOwner(t *testing.T) {
	c := s.client(t)
	id := owner()
	ctx := locktest.Ctx(t, s.long())
	for round := 0; round < 10; round++ {
		key := Key(t)
		const n = 4
		leases := make([]*dlock.Lease, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range leases {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				leases[i], errs[i] = c.Acquire(ctx, key, dlock.WithOwner(id))
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Acquire %d: %v", round, i, err)
			}
		}
		for i, l := range leases {
			if l.Fence() != leases[0].Fence() {
				t.Fatalf("round %d: fences differ: %d and %d", round, l.Fence(), leases[0].Fence())
			}
			if err := l.Err(); err != nil {
				t.Fatalf("round %d: lease %d: %v", round, i, err)
			}
		}
		s.assertHeld(t, key)
		for _, i := range mrand.Perm(n) {
			release(t, leases[i])
		}
		l, err := s.client(t).TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("round %d: lock not free after the last release: %v%s", round, err, s.holder(t, key))
		}
		release(t, l)
	}
}

// cancelledReentry: re-entries whose context ends at random points never
// free the lock under the outer hold, and once the outer hold is released
// the lock is free within the longest TTL used.
func (s *suite) cancelledReentry(t *testing.T) {
	key, id := Key(t), owner()
	ctx := locktest.Ctx(t, s.long())
	c, other := s.client(t), s.client(t)
	outer := locktest.MustAcquire(t, ctx, c, key, dlock.WithOwner(id))
	for i := 0; i < 20; i++ {
		for _, via := range []*dlock.Client{c, other} {
			cctx, cancel := context.WithTimeout(context.Background(), time.Duration(mrand.N(300))*time.Microsecond)
			l, err := via.TryAcquire(cctx, key, dlock.WithOwner(id), dlock.WithTTL(s.h.TTL*time.Duration(1+mrand.N(2))))
			cancel()
			if err == nil {
				release(t, l)
			}
		}
		if outer.Err() != nil {
			t.Fatalf("outer hold lost after cancelled re-entries: %v", outer.Err())
		}
		s.assertHeld(t, key)
	}
	release(t, outer)
	// A leftover of a re-entry whose answer was lost lasts at most its TTL.
	l, err := s.client(t).Acquire(locktest.Ctx(t, 2*s.h.TTL+s.h.Slack+s.long()/2), key)
	if err != nil {
		t.Fatalf("lock not free after the owner released everything: %v%s", err, s.holder(t, key))
	}
	release(t, l)
}

// forceReleaseReentry: after an operator removed a reentrant owner's
// lock, the owner's Release reports it, and a later Acquire by the same
// owner works.
func (s *suite) forceReleaseReentry(t *testing.T) {
	fb := s.h.NewBackend(t)
	defer fb.Close()
	fr, ok := fb.(dlock.ForceReleaser)
	if !ok {
		t.Skip("backend has no ForceRelease")
	}
	key, id := Key(t), owner()
	ctx := locktest.Ctx(t, s.long())
	c := s.client(t)
	l := locktest.MustAcquire(t, ctx, c, key, dlock.WithOwner(id))
	if _, err := fr.ForceRelease(ctx, key); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Release after ForceRelease: got %v, want ErrNotHeld or ErrLost", err)
	}
	l2, err := c.Acquire(ctx, key, dlock.WithOwner(id))
	if err != nil {
		t.Fatalf("Acquire by the same owner after its Release: %v", err)
	}
	release(t, l2)
}

// closeLeavesNothing: Close with waiters of the same Client queued behind
// its own holder leaves nothing held.
func (s *suite) closeLeavesNothing(t *testing.T) {
	for round := 0; round < 4; round++ {
		key := Key(t)
		c := dlock.New(s.h.NewBackend(t), dlock.WithTTL(20*s.h.TTL))
		holder := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), c, key)
		const n = 4
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			go func() {
				opts := []dlock.Option{}
				if s.h.FIFO && i%2 == 1 {
					opts = append(opts, dlock.WithFIFO())
				}
				l, err := c.Acquire(context.Background(), key, opts...)
				if err == nil && l.Err() == nil {
					err = errors.New("a waiter holds a live lease after Close")
				}
				errs <- err
			}()
		}
		time.Sleep(s.h.TTL / 10) // any phase of the waiters will do
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		for i := 0; i < n; i++ {
			if err := <-errs; err != nil && !errors.Is(err, dlock.ErrClosed) {
				t.Fatalf("waiter after Close: got %v, want ErrClosed", err)
			}
		}
		if err := holder.Err(); !errors.Is(err, dlock.ErrReleased) {
			t.Fatalf("holder after Close: got %v, want ErrReleased", err)
		}
		// A long TTL: a slow grant on a loaded machine is not taken for a
		// lock still held.
		s.assertFree(t, key, fmt.Sprintf("round %d: lock still held after Close", round), dlock.WithTTL(20*s.h.TTL))
	}
}

// limitWaits: Limit(3, Constant(d)) waits about 2d before giving up.
func (s *suite) limitWaits(t *testing.T) {
	key := Key(t)
	holder := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	defer release(t, holder)
	d := s.h.TTL / 5
	start := time.Now()
	_, err := s.client(t).Acquire(locktest.Ctx(t, s.long()), key, dlock.WithWait(dlock.Limit(3, dlock.Constant(d))))
	waited := time.Since(start)
	var ae *dlock.AcquireError
	if !errors.As(err, &ae) || ae.Cause != nil {
		t.Fatalf("Limit: got %v, want *AcquireError with no cause", err)
	}
	if waited < 2*d {
		t.Fatalf("Limit(3, Constant(%v)) gave up after %v, want at least %v", d, waited, 2*d)
	}
}

// contextKinds: every kind of context that ends a wait yields an error
// matching ErrNotAcquired, ctx.Err() and context.Cause(ctx), from
// Acquire, Do, AcquireMany and a FIFO wait.
func (s *suite) contextKinds(t *testing.T) {
	key := Key(t)
	// A long TTL: the holder must outlast every wait even when renewals
	// run late on a loaded machine.
	holder := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t, dlock.WithTTL(20*s.h.TTL)), key)
	defer release(t, holder)
	c := s.client(t)
	d := s.h.TTL / 5
	errBudget := errors.New("budget spent")
	kinds := map[string]func() (context.Context, func()){
		"Timeout": func() (context.Context, func()) { return context.WithTimeout(context.Background(), d) },
		"TimeoutCause": func() (context.Context, func()) {
			return context.WithTimeoutCause(context.Background(), d, errBudget)
		},
		"CancelCause": func() (context.Context, func()) {
			ctx, cancel := context.WithCancelCause(context.Background())
			tm := time.AfterFunc(d, func() { cancel(errBudget) })
			return ctx, func() { tm.Stop(); cancel(nil) }
		},
		"AfterFunc": func() (context.Context, func()) {
			parent, cancelParent := context.WithTimeout(context.Background(), d)
			ctx, cancel := context.WithCancel(context.Background())
			stop := context.AfterFunc(parent, cancel)
			return ctx, func() { stop(); cancel(); cancelParent() }
		},
		"WithoutCancelParent": func() (context.Context, func()) {
			parent, cancelParent := context.WithCancel(context.Background())
			cancelParent()
			return context.WithTimeout(context.WithoutCancel(parent), d)
		},
	}
	ops := map[string]func(ctx context.Context) error{
		"Acquire": func(ctx context.Context) error { _, err := c.Acquire(ctx, key); return err },
		"Do": func(ctx context.Context) error {
			return c.Do(ctx, key, func(context.Context, *dlock.Lease) error { return nil })
		},
		"AcquireMany": func(ctx context.Context) error { _, err := c.AcquireMany(ctx, []string{key, key + ".b"}); return err },
	}
	if s.h.FIFO {
		ops["FIFO"] = func(ctx context.Context) error { _, err := c.Acquire(ctx, key, dlock.WithFIFO()); return err }
	}
	for kname, kind := range kinds {
		for oname, op := range ops {
			ctx, cancel := kind()
			err := op(ctx)
			if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, ctx.Err()) || !errors.Is(err, context.Cause(ctx)) {
				t.Errorf("%s/%s: got %v, want ErrNotAcquired, %v and %v", kname, oname, err, ctx.Err(), context.Cause(ctx))
			}
			cancel()
		}
	}
}

// acquireManyEdges: AcquireMany on a closed Client reports ErrClosed even
// with an ended context; without auto-renew it never returns a lease that
// expired while a later key was awaited.
func (s *suite) acquireManyEdges(t *testing.T) {
	c := dlock.New(s.h.NewBackend(t), dlock.WithTTL(s.h.TTL))
	c.Close()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.AcquireMany(ended, []string{"a", "b"}); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("AcquireMany on a closed Client: got %v, want ErrClosed", err)
	}

	k1, k2 := Key(t)+".1", Key(t)+".2"
	blocker := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), k2, dlock.WithTTL(3*s.h.TTL), dlock.WithAutoRenew(false))
	defer blocker.Release(context.Background())
	ls, err := s.client(t).AcquireMany(locktest.Ctx(t, s.long()), []string{k1, k2}, dlock.WithAutoRenew(false))
	if err != nil {
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("AcquireMany: got %v, want success or ErrNotAcquired", err)
		}
		return
	}
	for _, l := range ls {
		if l.Err() != nil || !time.Now().Before(l.Expires()) {
			t.Errorf("AcquireMany returned lease %q already over: Err %v, Expires %v ago", l.Key(), l.Err(), time.Since(l.Expires()))
		}
		l.Release(context.Background())
	}
}

// ttlFloor: a backend with a minimum TTL refuses a shorter one with
// ErrInvalidTTL, from New and per call.
func (s *suite) ttlFloor(t *testing.T) {
	b := s.h.NewBackend(t)
	f, ok := b.(dlock.TTLFloor)
	if !ok {
		b.Close()
		t.Skip("backend has no TTL floor")
	}
	low := f.MinTTL() / 2
	if low < dlock.MinTTL {
		b.Close()
		t.Skipf("floor %v is the global minimum", f.MinTTL())
	}
	c := dlock.New(b, dlock.WithTTL(low))
	defer c.Close()
	if err := c.Err(); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("New with TTL %v below the floor %v: got %v, want ErrInvalidTTL", low, f.MinTTL(), err)
	}
	_, err := s.client(t).Acquire(locktest.Ctx(t, s.long()), Key(t), dlock.WithTTL(low))
	if !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("Acquire with TTL %v below the floor %v: got %v, want ErrInvalidTTL", low, f.MinTTL(), err)
	}
}

// closeKeepsOwnersShare: two Clients sharing an owner id hold a lock;
// closing one gives back only its share, the other's lease still holds
// the lock, and its release frees it. A backend that keeps owners per
// session (the second Client cannot take the lock) skips it.
func (s *suite) closeKeepsOwnersShare(t *testing.T) {
	id := owner()
	ctx := locktest.Ctx(t, s.long())
	for round := 0; round < 3; round++ {
		key := Key(t)
		c1 := dlock.New(s.h.NewBackend(t), dlock.WithTTL(s.h.TTL))
		l1 := locktest.MustAcquire(t, ctx, c1, key, dlock.WithOwner(id))
		l2, err := s.client(t).TryAcquire(ctx, key, dlock.WithOwner(id))
		if errors.Is(err, dlock.ErrNotAcquired) {
			c1.Close()
			t.Skip("the backend keeps owners per Client: a second Client of the owner waits")
		}
		if err != nil {
			t.Fatalf("round %d: TryAcquire by the owner's second Client: %v", round, err)
		}
		if round == 1 {
			release(t, l1) // a release, then Close, must not give back twice
		}
		if err := c1.Close(); err != nil {
			t.Fatalf("round %d: Close: %v", round, err)
		}
		if err := l2.Err(); err != nil {
			t.Fatalf("round %d: the other Client's lease after Close: %v", round, err)
		}
		s.assertHeld(t, key)
		release(t, l2)
		l, err := s.client(t, dlock.WithTTL(20*s.h.TTL)).TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("round %d: lock not free after the last release: %v%s", round, err, s.holder(t, key))
		}
		release(t, l)
	}
}

// minHold: a lease released inside its minimum hold keeps the lock on the
// server until the minimum hold ends, and frees it then.
func (s *suite) minHold(t *testing.T) {
	hold := 2 * s.h.TTL
	key := Key(t)
	c := s.client(t)
	ctx := locktest.Ctx(t, s.long())
	// Made and used before the clock starts: its first call dials (and
	// with Sentinel asks a sentinel first), which on a loaded machine can
	// outlast the hold.
	other := s.client(t, dlock.WithTTL(20*s.h.TTL))
	release(t, locktest.MustAcquire(t, ctx, other, key+".warm-up"))
	before := time.Now() // the grant is later: the minimum hold ends after before+hold
	l := locktest.MustAcquire(t, ctx, c, key, dlock.WithMinHold(hold))
	release(t, l)
	if time.Since(before) < hold-s.h.TTL/2 {
		// Held right after the release: an attempt that got the lock and
		// returned inside the hold shows it was free inside it. One that
		// returned later may have reached the server after the hold: the
		// wait below checks the same.
		l2, err := other.TryAcquire(ctx, key)
		switch since := time.Since(before); {
		case err == nil && since < hold:
			release(t, l2)
			t.Fatalf("TryAcquire by another client succeeded %v after the grant, inside the minimum hold %v", since, hold)
		case err == nil:
			release(t, l2)
		case !errors.Is(err, dlock.ErrNotAcquired):
			t.Fatalf("TryAcquire: got %v, want ErrNotAcquired", err)
		}
	}
	locktest.WaitFor(t, hold+s.h.TTL+s.h.Slack+5*time.Second,

		"the lock to be free after the minimum hold", func() bool {
			l2, err := other.TryAcquire(ctx, key)
			if err != nil {
				return false
			}
			if since := time.Since(before); since < hold {
				t.Fatalf("lock free %v after the grant, inside the minimum hold %v", since, hold)
			}
			release(t, l2)
			return true
		})

}
