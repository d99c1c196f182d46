package pglock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

var _ interface {
	dlock.Backend
	dlock.Notifier
	dlock.LossNotifier
	dlock.Inspector
	dlock.ForceReleaser
	dlock.TTLFloor
} = (*pglock.SessionBackend)(nil)

func TestSessionConformance(t *testing.T) {
	dlocktest.Run(t, dlocktest.Harness{
		NewBackend: func(t *testing.T) dlock.Backend {
			pool := newPool(t)
			return closingSession{pglock.NewSession(pool), pool}
		},
		TTL: ttl,
		Outage: func(t *testing.T) func() {
			t.Helper()
			if err := srv.Pause(); err != nil {
				t.Fatalf("pause postgres: %v", err)
			}
			return func() {
				if err := srv.Resume(); err != nil {
					t.Errorf("resume postgres: %v", err)
				}
			}
		},
		SessionBound: true,
	})
}

// A session terminated by the server frees the lock at once and the
// holder learns it through the loss signal at its next renewal.
func TestSessionTerminated(t *testing.T) {
	key := dlocktest.Key(t)
	ctx := ctxT(t, time.Minute)
	c := dlock.New(pglock.NewSession(newPool(t)), dlock.WithTTL(ttl))
	defer c.Close()
	l, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	other := dlock.New(pglock.NewSession(newPool(t)), dlock.WithTTL(ttl))
	defer other.Close()
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock: got %v, want ErrNotAcquired", err)
	}
	// The administrator ends the holder's session.
	admin := pglock.NewSession(newPool(t))
	defer admin.Close()
	info, err := admin.ForceRelease(ctx, key)
	if err != nil || !info.Held {
		t.Fatalf("ForceRelease: got %+v, %v; want the held lock", info, err)
	}
	l2, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire after the holder's session ended: %v", err)
	}
	defer l2.Release(context.Background())
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence after takeover: got %d, want > %d", l2.Fence(), l.Fence())
	}
	select {
	case <-l.Done():
	case <-time.After(5 * ttl):
		t.Fatal("holder whose session was terminated: Done not closed")
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("holder's Err: got %v, want ErrLost", err)
	}
}

// A holder that stops renewing loses the lock with its session: the
// server ends a session idle for the lease's TTL.
func TestSessionIdleTimeout(t *testing.T) {
	key := dlocktest.Key(t)
	ctx := ctxT(t, time.Minute)
	c := dlock.New(pglock.NewSession(newPool(t)), dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	defer c.Close()
	l, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	other := dlock.New(pglock.NewSession(newPool(t)), dlock.WithTTL(ttl), dlock.WithWait(dlock.Constant(20*time.Millisecond)))
	defer other.Close()
	l2, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire after the holder went idle: %v", err)
	}
	defer l2.Release(context.Background())
	if time.Now().Before(l.Expires()) {
		t.Fatalf("lock taken over at %v, before the holder's Expires %v", time.Now(), l.Expires())
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence after takeover: got %d, want > %d", l2.Fence(), l.Fence())
	}
}

// Refresh checks the session; Release unlocks once, then ErrNotHeld.
func TestSessionRefreshRelease(t *testing.T) {
	b := pglock.NewSession(newPool(t))
	defer b.Close()
	ctx := ctxT(t, time.Minute)
	r := dlock.Request{Key: dlocktest.Key(t), Token: "t", TTL: time.Second}
	g, err := b.TryAcquire(ctx, r)
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire: %+v, %v", g, err)
	}
	r.Fence = g.Fence
	if err := b.Refresh(ctx, r); err != nil {
		t.Fatalf("Refresh on a session: %v", err)
	}
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := b.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release: got %v, want ErrNotHeld", err)
	}
}

// A hold whose last loss registration stops without a release (the Client
// gave the lease up, as after a local loss) is given up: its lock is
// unlocked and the key can be taken again, also through the same
// SessionBackend. A hold that still has a registration stays held.
func TestSessionGivenUpWhenUnwatched(t *testing.T) {
	s := pglock.NewSession(newPool(t))
	defer s.Close()
	ctx := ctxT(t, 10*time.Second)
	key := dlocktest.Key(t)
	r := dlock.Request{Key: key, Token: "a", TTL: 5 * time.Second}
	g, err := s.TryAcquire(ctx, r)
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire(a): got %+v, %v; want granted", g, err)
	}
	r.Fence = g.Fence
	stop1 := s.NotifyLoss(r, func(error) {})
	stop2 := s.NotifyLoss(r, func(error) {})
	stop1()
	other := dlock.Request{Key: key, Token: "b", TTL: 5 * time.Second}
	if g, err := s.TryAcquire(ctx, other); err != nil || g.OK {
		t.Fatalf("TryAcquire(b) with a registration left: got %+v, %v; want not granted", g, err)
	}
	stop2()
	stop2() // stopping twice counts once
	for {
		g, err := s.TryAcquire(ctx, other)
		if err != nil {
			t.Fatalf("TryAcquire(b) after the last stop: %v", err)
		}
		if g.OK {
			if g.Fence <= r.Fence {
				t.Fatalf("TryAcquire(b): got fence %d, want above %d", g.Fence, r.Fence)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the hold was not given up after its last registration stopped")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := s.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release(a) after it was given up: got %v, want ErrNotHeld", err)
	}
}
