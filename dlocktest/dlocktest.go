// Package dlocktest is the conformance suite every dlock backend passes,
// in the manner of testing/fstest: Run takes the implementation as an
// argument and probes optional capabilities by type assertion.
//
//	func TestConformance(t *testing.T) {
//		dlocktest.Run(t, dlocktest.Harness{
//			NewBackend: func(t *testing.T) dlock.Backend { return redislock.New(rdb) },
//			TTL:        500 * time.Millisecond,
//		})
//	}
//
// The suite only uses the public dlock API. Backends are tested against
// real servers: NewBackend returns a new connection on each call, the way
// separate processes would connect.
package dlocktest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// Key returns a key unique to the test.
func Key(t *testing.T) string { return locktest.Key(t) }

// Harness describes the backend under test.
type Harness struct {
	// NewBackend returns a new connection to the server under test. The
	// suite closes each backend through Client.Close. Required.
	NewBackend func(t *testing.T) dlock.Backend

	// TTL is the lease TTL the suite uses. Default 500ms; set it to at
	// least the backend's minimum (etcd: 2s).
	TTL time.Duration

	// Slack is how late after a deadline (a TTL running out) an effect may
	// be observed: a freed lock, a lost lease. Default TTL/2 + 100ms.
	Slack time.Duration

	// Outage, when set, makes the server stop answering (pause or kill it)
	// and returns a function that brings it back. The lost-lease test is
	// skipped when nil.
	Outage func(t *testing.T) (restore func())

	// FIFO reports that the backend implements a server-side queue
	// (dlock.Waiter) serving WithFIFO waiters in arrival order.
	FIFO bool

	// SessionBound reports that a lock lives as long as the holder's
	// session (ZooKeeper) rather than until its TTL runs out without
	// renewal: the tests that let a lease expire are skipped.
	SessionBound bool
}

func (h *Harness) defaults(t *testing.T) {
	t.Helper()
	if h.NewBackend == nil {
		t.Fatal("dlocktest: Harness.NewBackend is required")
	}
	if h.TTL == 0 {
		h.TTL = 500 * time.Millisecond
	}
	if h.Slack == 0 {
		h.Slack = h.TTL/2 + 100*time.Millisecond
	}
}

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	h.defaults(t)
	s := &suite{h: h}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"MutualExclusion", s.mutualExclusion},
		{"FencesIncrease", s.fencesIncrease},
		{"TryAcquireHeld", s.tryAcquireHeld},
		{"ReleaseFrees", s.releaseFrees},
		{"ExpiryFrees", s.expiryFrees},
		{"FenceIncreasesAfterExpiry", s.fenceAfterExpiry},
		{"ReleaseForeignToken", s.releaseForeignToken},
		{"ReleaseAfterTakeover", s.releaseAfterTakeover},
		{"DoubleRelease", s.doubleRelease},
		{"RefreshExtends", s.refreshExtends},
		{"RefreshAfterRelease", s.refreshAfterRelease},
		{"AutoRenewHolds", s.autoRenewHolds},
		{"LostWhenServerStops", s.lostWhenServerStops},
		{"CancelWait", s.cancelWait},
		{"DeadlineWait", s.deadlineWait},
		{"WaitWokenByRelease", s.wokenByRelease},
		{"DoReleases", s.doReleases},
		{"DoReleasesOnPanic", s.doReleasesOnPanic},
		{"Reentrant", s.reentrant},
		{"FIFO", s.fifo},
		{"BadInput", s.badInput},
		{"ReentryShorterTTL", s.reentryShorterTTL},
		{"RefreshShorterTTL", s.refreshShorterTTL},
		{"BackendDeadline", s.backendDeadline},
		{"BackendFence", s.backendFence},
		{"SharedOwner", s.sharedOwner},
		{"CancelledReentry", s.cancelledReentry},
		{"ForceReleaseReentry", s.forceReleaseReentry},
		{"CloseLeavesNothing", s.closeLeavesNothing},
		{"CloseKeepsOwnersShare", s.closeKeepsOwnersShare},
		{"MinHold", s.minHold},
		{"LimitWaits", s.limitWaits},
		{"ContextKinds", s.contextKinds},
		{"AcquireManyEdges", s.acquireManyEdges},
		{"TTLFloor", s.ttlFloor},
		{"Stress", s.stress},
		{"SemaphoreLimit", s.semaphoreLimit},
		{"SemaphoreConcurrent", s.semaphoreConcurrent},
		{"SemaphoreBadInput", s.semaphoreBadInput},
		{"SemaphoreExpiry", s.semaphoreExpiry},
		{"RWShare", s.rwShare},
		{"RWWriterFirst", s.rwWriterFirst},
		{"RWBadInput", s.rwBadInput},
		{"FIFOOrder", s.fifoOrder},
		{"CancelQueued", s.cancelQueued},
		{"Election", s.election},
		{"ElectionLost", s.electionLost},
		{"ObserverBalance", s.observerBalance},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct{ h Harness }

// client returns a new Client on a new backend connection, closed at the
// end of the test.
func (s *suite) client(t *testing.T, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	opts = append([]dlock.Option{dlock.WithTTL(s.h.TTL)}, opts...)
	return locktest.Closing(t, dlock.New(s.h.NewBackend(t), opts...))
}

func (s *suite) long() time.Duration { return 10*s.h.TTL + 10*time.Second }

func release(t *testing.T, l *dlock.Lease) {
	t.Helper()
	if err := l.Release(context.Background()); err != nil {
		t.Errorf("Release(%q): %v", l.Key(), err)
	}
}

// assertFree checks that another client, with opts, takes key now (and
// releases it); what names the check in the failure.
func (s *suite) assertFree(t *testing.T, key, what string, opts ...dlock.Option) {
	t.Helper()
	l, err := s.client(t, opts...).TryAcquire(locktest.Ctx(t, s.long()), key)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	release(t, l)
}

// endsCancelled checks that the acquisition started by locktest.Go whose
// outcome got receives returns, within s.long(), an error matching
// dlock.ErrNotAcquired and context.Canceled; what names it.
func (s *suite) endsCancelled(t *testing.T, got <-chan locktest.Outcome, what string) {
	t.Helper()
	select {
	case r := <-got:
		if !errors.Is(r.Err, dlock.ErrNotAcquired) || !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("%s: got %v, want ErrNotAcquired and context.Canceled", what, r.Err)
		}
	case <-time.After(s.long()):
		t.Fatalf("%s did not return", what)
	}
}

// assertHeld checks that another client cannot take key now.
func (s *suite) assertHeld(t *testing.T, key string) {
	t.Helper()
	l, err := s.client(t).TryAcquire(locktest.Ctx(t, s.long()), key)
	if err == nil {
		l.Release(context.Background())
		t.Fatalf("TryAcquire(%q) by another client succeeded, want the lock held", key)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q): got %v, want ErrNotAcquired", key, err)
	}
}

// holder describes key's holder for a failure message, as the backend
// reports it (Inspector), or returns "" when it cannot.
func (s *suite) holder(t *testing.T, key string) string {
	b := s.h.NewBackend(t)
	defer b.Close()
	in, ok := b.(dlock.Inspector)
	if !ok {
		return ""
	}
	info, err := in.Inspect(locktest.Ctx(t, s.long()), key)
	if err != nil {
		return fmt.Sprintf(" (Inspect: %v)", err)
	}
	return fmt.Sprintf(" (Inspect: held %v by %q, count %d, fence %d, TTL left %v)", info.Held, info.Owner, info.Count, info.Fence, info.TTL)
}

func (s *suite) mutualExclusion(t *testing.T) {
	const clients, perClient = 4, 25
	key := Key(t)
	var (
		counter   int // deliberately unprotected except by the lock
		inside    atomic.Int32
		lastFence uint64
		wg        sync.WaitGroup
	)
	ctx := locktest.Ctx(t, s.long()*3)
	errs := make(chan error, clients*perClient)
	for i := 0; i < clients; i++ {
		c := s.client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < perClient; j++ {
				err := c.Do(ctx, key, func(ctx context.Context, l *dlock.Lease) error {
					if n := inside.Add(1); n != 1 {
						errs <- errors.New("two holders inside the critical section")
					}
					if l.Fence() <= lastFence {
						errs <- errors.New("fence did not increase")
					}
					lastFence = l.Fence()
					v := counter
					time.Sleep(100 * time.Microsecond) // widen the race window
					counter = v + 1
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if counter != clients*perClient {
		t.Fatalf("counter: got %d, want %d", counter, clients*perClient)
	}
}

func (s *suite) fencesIncrease(t *testing.T) {
	key := Key(t)
	a, b := s.client(t), s.client(t)
	ctx := locktest.Ctx(t, s.long())
	var last uint64
	for i := 0; i < 10; i++ {
		c := a
		if i%2 == 1 {
			c = b
		}
		l := locktest.MustAcquire(t, ctx, c, key)
		if l.Fence() <= last {
			t.Fatalf("acquisition %d: fence got %d, want > %d", i, l.Fence(), last)
		}
		last = l.Fence()
		release(t, l)
	}
}

func (s *suite) tryAcquireHeld(t *testing.T) {
	key := Key(t)
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	defer release(t, l)
	// The holder is renewed for longer than the context lasts: a
	// TryAcquire that waited would end with the context's error.
	_, err := s.client(t).TryAcquire(locktest.Ctx(t, s.long()), key)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire waited until its context ended: %v", err)
	}
	var ae *dlock.AcquireError
	if !errors.As(err, &ae) || !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a held lock: got %v, want *AcquireError matching ErrNotAcquired", err)
	}
	if ae.Cause != nil || ae.Attempts != 1 {
		t.Fatalf("TryAcquire: got Cause=%v Attempts=%d, want nil and 1", ae.Cause, ae.Attempts)
	}
}

func (s *suite) releaseFrees(t *testing.T) {
	key := Key(t)
	c := s.client(t)
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), c, key)
	release(t, l)
	select {
	case <-l.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("Err after Release: got %v, want ErrReleased", err)
	}
	s.assertFree(t, key, "TryAcquire after Release")
}

func (s *suite) skipExpiry(t *testing.T) {
	t.Helper()
	if s.h.SessionBound {
		t.Skip("locks live as long as the holder's session; they do not expire by TTL")
	}
}

func (s *suite) expiryFrees(t *testing.T) {
	s.skipExpiry(t)
	key := Key(t)
	holder := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key, dlock.WithAutoRenew(false))
	invoke := holder.Expires() // ≤ invoke + TTL
	l, err := s.client(t).Acquire(locktest.Ctx(t, s.long()), key)
	if err != nil {
		t.Fatalf("Acquire after expiry: %v", err)
	}
	defer release(t, l)
	if late := time.Since(invoke); late > s.h.Slack+dlock.Drift(s.h.TTL) {
		t.Fatalf("lock freed %v after the holder's Expires, want within %v", late, s.h.Slack)
	}
	select {
	case <-holder.Done():
	case <-time.After(s.h.Slack):
		t.Fatal("expired lease: Done not closed")
	}
	if err := holder.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("expired lease Err: got %v, want ErrLost", err)
	}
}

func (s *suite) fenceAfterExpiry(t *testing.T) {
	s.skipExpiry(t)
	a, b := s.takeOver(t, Key(t))
	if b.Fence() <= a.Fence() {
		t.Fatalf("fence after expiry: got %d, want > %d", b.Fence(), a.Fence())
	}
}

// takeOver returns a lease on key left to expire without renewal, and
// the lease another client took once it had ended, released when the test
// ends.
func (s *suite) takeOver(t *testing.T, key string) (old, cur *dlock.Lease) {
	t.Helper()
	old = locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key, dlock.WithAutoRenew(false))
	<-old.Done()
	cur = locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	t.Cleanup(func() { release(t, cur) })
	return old, cur
}

// releaseForeignToken calls the backend directly with a token that does
// not hold the lock.
func (s *suite) releaseForeignToken(t *testing.T) {
	key := Key(t)
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	defer release(t, l)
	b := s.h.NewBackend(t)
	defer b.Close()
	req := dlock.Request{Key: key, Token: "not-the-owner", TTL: s.h.TTL, Fence: l.Fence()}
	if err := b.Release(locktest.Ctx(t, s.long()), req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release with a foreign token: got %v, want ErrNotHeld", err)
	}
	if err := b.Refresh(locktest.Ctx(t, s.long()), req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh with a foreign token: got %v, want ErrNotHeld", err)
	}
	s.assertHeld(t, key)
}

func (s *suite) releaseAfterTakeover(t *testing.T) {
	s.skipExpiry(t)
	key := Key(t)
	old, cur := s.takeOver(t, key)
	err := old.Release(locktest.Ctx(t, s.long()))
	if !errors.Is(err, dlock.ErrLost) && !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release of a taken-over lease: got %v, want ErrLost or ErrNotHeld", err)
	}
	if err := old.Refresh(locktest.Ctx(t, s.long()), 0); !errors.Is(err, dlock.ErrLost) && !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("Refresh of a taken-over lease: got %v, want ErrLost", err)
	}
	if cur.Err() != nil {
		t.Fatalf("new holder after the old one's Release: Err %v, want nil", cur.Err())
	}
	s.assertHeld(t, key)
}

func (s *suite) doubleRelease(t *testing.T) {
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), Key(t))
	release(t, l)
	if err := l.Release(locktest.Ctx(t, s.long())); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("second Release: got %v, want ErrReleased", err)
	}
}

func (s *suite) refreshAfterRelease(t *testing.T) {
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), Key(t))
	release(t, l)
	if err := l.Refresh(locktest.Ctx(t, s.long()), 0); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("Refresh after Release: got %v, want ErrReleased", err)
	}
}

func (s *suite) refreshExtends(t *testing.T) {
	key := Key(t)
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key, dlock.WithAutoRenew(false))
	defer release(t, l)
	first := l.Expires()
	if err := l.Refresh(locktest.Ctx(t, s.long()), 4*s.h.TTL); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if got := l.Expires(); !got.After(first.Add(s.h.TTL)) {
		t.Fatalf("Expires after Refresh(4×TTL): got +%v, want later than +%v", got.Sub(first), s.h.TTL)
	}
	if got := l.TTL(); got != 4*s.h.TTL {
		t.Fatalf("TTL after Refresh: got %v, want %v", got, 4*s.h.TTL)
	}
	// Past the original expiry the lock is still held.
	time.Sleep(time.Until(first.Add(s.h.Slack)))
	if l.Err() != nil {
		t.Fatalf("lease ended after Refresh: %v", l.Err())
	}
	s.assertHeld(t, key)
}

func (s *suite) autoRenewHolds(t *testing.T) {
	key := Key(t)
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	defer release(t, l)
	select {
	case <-l.Done():
		t.Fatalf("auto-renewed lease ended: %v", l.Err())
	case <-time.After(5 * s.h.TTL):
	}
	if time.Until(l.Expires()) <= 0 {
		t.Fatalf("Expires %v is in the past for a renewed lease", l.Expires())
	}
	s.assertHeld(t, key)
}

func (s *suite) lostWhenServerStops(t *testing.T) {
	if s.h.Outage == nil {
		t.Skip("Harness.Outage not set")
	}
	key := Key(t)
	var onLost atomic.Int32
	c := s.client(t, dlock.WithOnLost(func(*dlock.Lease, error) { onLost.Add(1) }))
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), c, key)
	work, cancel := l.Context(context.Background())
	defer cancel()
	restore := s.h.Outage(t)
	start := time.Now()
	select {
	case <-l.Done():
	case <-time.After(s.h.TTL + s.h.Slack):
		restore()
		t.Fatalf("lease not reported lost %v after the server stopped", s.h.TTL+s.h.Slack)
	}
	lostAfter := time.Since(start)
	restore()
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err after outage: got %v, want ErrLost", err)
	}
	if err := context.Cause(work); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("lease context cause: got %v, want ErrLost", err)
	}
	if time.Now().Before(l.Expires()) {
		t.Fatalf("reported lost at %v before Expires %v", time.Now(), l.Expires())
	}
	t.Logf("lost %v after the outage began (TTL %v)", lostAfter, s.h.TTL)
	// Another client takes the lock once the server is back.
	l2 := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	release(t, l2)
	if err := l.Release(locktest.Ctx(t, s.long())); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Release of a lost lease: got %v, want ErrLost", err)
	}
	locktest.WaitFor(t, s.h.Slack, "OnLost called once", func() bool { return onLost.Load() == 1 })
}

func (s *suite) cancelWait(t *testing.T) {
	key := Key(t)
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	defer release(t, l)
	ctx, cancel := context.WithCancel(context.Background())
	c := s.client(t)
	got := locktest.Go(func() (*dlock.Lease, error) { return c.Acquire(ctx, key) })
	time.Sleep(s.h.TTL / 10) // let it start waiting (not a condition: any phase must cancel)
	cancel()
	// The holder is renewed until the test ends: only the cancellation
	// can end the wait.
	s.endsCancelled(t, got, "cancelled wait")
	if l.Err() != nil {
		t.Fatalf("holder affected by a cancelled waiter: %v", l.Err())
	}
}

func (s *suite) deadlineWait(t *testing.T) {
	key := Key(t)
	l := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	defer release(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), s.h.TTL/5)
	defer cancel()
	start := time.Now()
	_, err := s.client(t).Acquire(ctx, key)
	if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait past deadline: got %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if d := time.Since(start); d < s.h.TTL/5 || d > s.h.TTL/5+s.h.Slack {
		t.Fatalf("wait returned %v after start, want after its deadline %v and within %v of it", d, s.h.TTL/5, s.h.Slack)
	}
}

func (s *suite) wokenByRelease(t *testing.T) {
	key := Key(t)
	// A long TTL and a long strategy ceiling: only the release can wake the
	// waiter quickly.
	holder := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t, dlock.WithTTL(20*s.h.TTL)), key)
	c := s.client(t, dlock.WithWait(dlock.Constant(time.Minute)))
	got := make(chan *dlock.Lease, 1)
	errc := make(chan error, 1)
	wctx := locktest.Ctx(t, time.Minute)
	go func() {
		l, err := c.Acquire(wctx, key)
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	time.Sleep(s.h.TTL / 5)
	released := time.Now()
	release(t, holder)
	select {
	case l := <-got:
		t.Logf("waiter acquired %v after the release", time.Since(released))
		release(t, l)
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(s.h.TTL + s.h.Slack):
		t.Fatalf("waiter not woken within %v of the release", s.h.TTL+s.h.Slack)
	}
}

func (s *suite) doReleases(t *testing.T) {
	key := Key(t)
	c := s.client(t)
	var lease *dlock.Lease
	errBoom := errors.New("boom")
	err := c.Do(locktest.Ctx(t, s.long()), key, func(ctx context.Context, l *dlock.Lease) error {
		lease = l
		if ctx.Err() != nil {
			t.Errorf("Do's context already done: %v", ctx.Err())
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Do: got %v, want fn's error", err)
	}
	if !errors.Is(lease.Err(), dlock.ErrReleased) {
		t.Fatalf("lease after Do: got %v, want ErrReleased", lease.Err())
	}
	// A cancelled caller context still releases.
	ctx, cancel := context.WithCancel(context.Background())
	err = c.Do(ctx, key, func(context.Context, *dlock.Lease) error { cancel(); return nil })
	if err != nil {
		t.Fatalf("Do with the context cancelled inside fn: %v", err)
	}
	s.assertFree(t, key, "lock not released by Do")
}

func (s *suite) doReleasesOnPanic(t *testing.T) {
	key := Key(t)
	c := s.client(t)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the panic of fn re-raised", p)
			}
		}()
		c.Do(locktest.Ctx(t, s.long()), key, func(context.Context, *dlock.Lease) error { panic("boom") })
	}()
	s.assertFree(t, key, "lock not released after a panic in Do")
}

func (s *suite) reentrant(t *testing.T) {
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	c := s.client(t, dlock.WithOwner("owner-"+rand.Text()[:6]))
	l1 := locktest.MustAcquire(t, ctx, c, key)
	l2 := locktest.MustAcquire(t, ctx, c, key)
	l3, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("reentrant TryAcquire: %v", err)
	}
	if l1.Fence() != l2.Fence() || l2.Fence() != l3.Fence() {
		t.Fatalf("nested fences: got %d %d %d, want equal", l1.Fence(), l2.Fence(), l3.Fence())
	}
	if l1.Count() != 1 || l2.Count() != 2 || l3.Count() != 3 {
		t.Fatalf("hold counts: got %d %d %d, want 1 2 3", l1.Count(), l2.Count(), l3.Count())
	}
	s.assertHeld(t, key) // a different owner waits
	release(t, l3)
	release(t, l2)
	s.assertHeld(t, key)
	release(t, l1)
	l, err := s.client(t).TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire after the last reentrant release: %v", err)
	}
	release(t, l)
}

func (s *suite) fifo(t *testing.T) {
	if !s.h.FIFO {
		t.Skip("backend has no server-side queue")
	}
	key := Key(t)
	holder := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	// A cancelled queued waiter leaves the queue: the live one behind it
	// is served after the release.
	cctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	c1 := s.client(t)
	go func() {
		_, err := c1.Acquire(cctx, key, dlock.WithFIFO())
		cancelled <- err
	}()
	time.Sleep(s.h.TTL / 10)
	got := make(chan error, 1)
	var second *dlock.Lease
	c2 := s.client(t)
	wctx := locktest.Ctx(t, s.long())
	go func() {
		var err error
		second, err = c2.Acquire(wctx, key, dlock.WithFIFO())
		got <- err
	}()
	time.Sleep(s.h.TTL / 10)
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled FIFO waiter: got %v, want context.Canceled", err)
	}
	release(t, holder)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("FIFO waiter: %v", err)
		}
		release(t, second)
	case <-time.After(s.h.TTL + s.h.Slack):
		t.Fatal("FIFO waiter behind a cancelled one not served after release")
	}
}

func (s *suite) badInput(t *testing.T) {
	c := s.client(t)
	ctx := locktest.Ctx(t, s.long())
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"EmptyKey", func() error { _, err := c.Acquire(ctx, ""); return err }, dlock.ErrInvalidKey},
		{"LongKey", func() error { _, err := c.Acquire(ctx, strings.Repeat("k", dlock.MaxKeyLen+1)); return err }, dlock.ErrInvalidKey},
		{"ZeroTTL", func() error { _, err := c.Acquire(ctx, "k", dlock.WithTTL(0)); return err }, dlock.ErrInvalidTTL},
		{"NegativeTTL", func() error { _, err := c.Acquire(ctx, "k", dlock.WithTTL(-time.Second)); return err }, dlock.ErrInvalidTTL},
		{"SubMillisecondTTL", func() error { _, err := c.Acquire(ctx, "k", dlock.WithTTL(time.Microsecond)); return err }, dlock.ErrInvalidTTL},
		{"NilContext", func() error {
			//lint:ignore SA1012 testing nil context handling
			_, err := c.Acquire(nil, "k") //nolint:staticcheck
			return err
		}, dlock.ErrInvalidOption},
		{"NilWait", func() error { _, err := c.Acquire(ctx, "k", dlock.WithWait(nil)); return err }, dlock.ErrInvalidOption},
		{"EmptyOwner", func() error { _, err := c.Acquire(ctx, "k", dlock.WithOwner("")); return err }, dlock.ErrInvalidOption},
		{"NilDo", func() error { return c.Do(ctx, "k", nil) }, dlock.ErrInvalidOption},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "dlock: ") {
				t.Fatalf("error %q does not start with \"dlock: \"", err)
			}
		})
	}
}
