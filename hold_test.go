package dlock_test

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/memlock"
)

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
				ctx := context.Background()
				other := releaseInMinHold(t, time.Second, tc.opts...)
				time.Sleep(900 * time.Millisecond)
				if _, err := other.TryAcquire(ctx, "job"); !errors.Is(err, dlock.ErrNotAcquired) {
					t.Fatalf("900ms into a 1s minimum hold: got %v, want ErrNotAcquired", err)
				}
				time.Sleep(200 * time.Millisecond)
				synctest.Wait()
				l2, err := other.TryAcquire(ctx, "job")
				if err != nil {
					t.Fatalf("after the minimum hold: %v", err)
				}
				l2.Release(ctx)
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
		ctx := context.Background()
		other := releaseInMinHold(t, math.MaxInt64)
		time.Sleep(time.Hour)
		if _, err := other.TryAcquire(ctx, "job"); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("an hour into an endless minimum hold: got %v, want ErrNotAcquired", err)
		}
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
		held  bool // the lock is still held just before the minimum hold ends
	}{
		{"Once", 1, true},
		{"Always", 1 << 30, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memlock.NewStore()
				b := &flakyRefresh{Backend: store.Backend()}
				c := dlock.New(b, dlock.WithMinHold(2*time.Second), dlock.WithTTL(500*time.Millisecond), dlock.WithAutoRenew(false))
				defer c.Close()
				other := dlock.New(store.Backend())
				defer other.Close()
				ctx := context.Background()
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
				if tc.held {
					time.Sleep(1900 * time.Millisecond)
					if _, err := other.TryAcquire(ctx, "job"); !errors.Is(err, dlock.ErrNotAcquired) {
						t.Fatalf("1.9s into a 2s minimum hold: got %v, want ErrNotAcquired", err)
					}
				} else if left := time.Until(expires); left > 50*time.Millisecond {
					t.Fatalf("Release gave up %v before the lock's expiry", left)
				}
				time.Sleep(time.Until(l.Expires().Add(2100 * time.Millisecond)))
				synctest.Wait()
				l2, err := other.TryAcquire(ctx, "job")
				if err != nil {
					t.Fatalf("after the minimum hold: %v", err)
				}
				l2.Release(ctx)
			})
		})
	}
}

func TestMaxHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memlock.NewStore()
		c := dlock.New(store.Backend(), dlock.WithTTL(300*time.Millisecond), dlock.WithMaxHold(time.Second))
		defer c.Close()
		other := dlock.New(store.Backend())
		defer other.Close()
		ctx := context.Background()
		l := locktest.MustAcquire(t, ctx, c, "job")
		work, cancel := l.Context(ctx)
		defer cancel()
		time.Sleep(900 * time.Millisecond)
		if l.Err() != nil {
			t.Fatalf("lease ended before its maximum hold: %v", l.Err())
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if err := l.Err(); !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrMaxHold) {
			t.Fatalf("after the maximum hold: got %v, want ErrLost and ErrMaxHold", err)
		}
		if !errors.Is(context.Cause(work), dlock.ErrMaxHold) {
			t.Fatalf("lease context cause: got %v, want ErrMaxHold", context.Cause(work))
		}
		l2, err := other.TryAcquire(ctx, "job")
		if err != nil {
			t.Fatalf("lock not given back at the maximum hold: %v", err)
		}
		l2.Release(ctx)
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
