package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// ledger is an Observer that checks the events' bookkeeping: every
// Acquire call starts and ends once, every wait starts and ends once, and
// every lease handed out by an AcquireEnd ends exactly once, by a loss or
// by the Release (or Close) that ended it, and no other lease ends.
type ledger struct {
	mu       sync.Mutex
	starts   int
	ends     int
	waits    int // wait starts minus wait ends
	acquired map[*dlock.Lease]bool
	ended    map[*dlock.Lease]string
	bad      []string
}

func newLedger() *ledger {
	return &ledger{acquired: map[*dlock.Lease]bool{}, ended: map[*dlock.Lease]string{}}
}

func (g *ledger) Observe(ctx context.Context, e dlock.Event) context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch e.Kind {
	case dlock.EventAcquireStart:
		g.starts++
	case dlock.EventAcquireEnd:
		g.ends++
		if e.Err == nil && e.Lease != nil {
			g.acquired[e.Lease] = true
		}
	case dlock.EventWaitStart:
		g.waits++
	case dlock.EventWaitEnd:
		g.waits--
	case dlock.EventLost:
		g.end(e.Lease, "lost")
	case dlock.EventReleased:
		// The Release that ended the lease; a repeated Release, or the
		// Release of a lease lost before, ends nothing.
		if e.Lease != nil && errors.Is(e.Lease.Err(), dlock.ErrReleased) &&
			(e.Err == nil || !errors.Is(e.Err, dlock.ErrReleased)) {
			g.end(e.Lease, "released")
		}
	}
	return ctx
}

func (g *ledger) end(l *dlock.Lease, how string) {
	switch {
	case l == nil:
		g.bad = append(g.bad, how+" without a lease")
	case g.ended[l] != "":
		g.bad = append(g.bad, fmt.Sprintf("lease of %q %s after it was %s", l.Key(), how, g.ended[l]))
	default:
		// A loss may be reported before the AcquireEnd of its lease (found
		// while the call was returning): check matches them at the end.
		g.ended[l] = how
	}
}

// check fails t unless the books balance once every lease has ended.
func (g *ledger) check(t *testing.T, what string) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	bad := g.bad
	if g.starts != g.ends {
		bad = append(bad, fmt.Sprintf("%d acquire starts, %d ends", g.starts, g.ends))
	}
	if g.waits != 0 {
		bad = append(bad, fmt.Sprintf("%d wait starts without an end", g.waits))
	}
	for l := range g.acquired {
		if g.ended[l] == "" {
			bad = append(bad, fmt.Sprintf("lease of %q acquired, never reported released or lost (Err %v)", l.Key(), l.Err()))
		}
	}
	for l, how := range g.ended {
		if !g.acquired[l] {
			bad = append(bad, fmt.Sprintf("a lease of %q never reported acquired was reported %s", l.Key(), how))
		}
	}
	for _, b := range bad {
		t.Errorf("%s: %s", what, b)
	}
}

// observerBalance: what an Observer hears balances — every acquisition
// reported ends, every wait ends, every lease handed out ends once (by
// loss or release) — through AcquireMany (taken, refused after a wait),
// Client.Close with leases held, and a re-entry that finds its lock gone.
func (s *suite) observerBalance(t *testing.T) {
	ctx := locktest.Ctx(t, s.long())
	t.Run("AcquireMany", func(t *testing.T) {
		g := newLedger()
		c := s.client(t, dlock.WithObserver(g))
		tag := "{" + Key(t) + "}"
		keys := []string{tag + "a", tag + "b", tag + "c"}
		ls, err := c.AcquireMany(ctx, keys)
		if err != nil {
			t.Fatalf("AcquireMany: %v", err)
		}
		// Another Client of the same observer waits for keys held here
		// and gives up.
		c2 := s.client(t, dlock.WithObserver(g))
		wctx, cancel := context.WithTimeout(ctx, s.h.TTL/2)
		_, err = c2.AcquireMany(wctx, keys)
		cancel()
		if !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("AcquireMany of held keys: got %v, want ErrNotAcquired", err)
		}
		for _, l := range ls {
			release(t, l)
		}
		g.check(t, "AcquireMany")
	})
	t.Run("Close", func(t *testing.T) {
		g := newLedger()
		c := dlock.New(s.h.NewBackend(t), dlock.WithTTL(s.h.TTL), dlock.WithObserver(g))
		key, id := Key(t), owner()
		locktest.MustAcquire(t, ctx, c, key+".plain")
		locktest.MustAcquire(t, ctx, c, key, dlock.WithOwner(id))
		locktest.MustAcquire(t, ctx, c, key, dlock.WithOwner(id))
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		g.check(t, "Close")
	})
	t.Run("ReentryFindsLockGone", func(t *testing.T) {
		fb := s.h.NewBackend(t)
		defer fb.Close()
		fr, ok := fb.(dlock.ForceReleaser)
		if !ok {
			t.Skip("backend has no ForceRelease")
		}
		g := newLedger()
		c := s.client(t, dlock.WithObserver(g))
		key, id := Key(t), owner()
		l := locktest.MustAcquire(t, ctx, c, key, dlock.WithOwner(id))
		if _, err := fr.ForceRelease(ctx, key); err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		// A longer TTL than the hold's: the re-entry asks the server.
		if l2, err := c.Acquire(ctx, key, dlock.WithOwner(id), dlock.WithTTL(4*s.h.TTL)); err == nil {
			t.Fatalf("re-entry after ForceRelease: got a lease (Err %v), want an error", l2.Err())
		}
		// Done, not Err: observers hear of a loss after Err is set and
		// before Done closes.
		select {
		case <-l.Done():
		case <-time.After(s.long()):
			t.Fatal("the first hold did not end")
		}
		_ = l.Release(ctx)
		g.check(t, "re-entry")
	})
}
