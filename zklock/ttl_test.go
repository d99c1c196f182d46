package zklock_test

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// TestDefaultTTLRightAfterConnect creates the Client the moment Connect
// returns, before the session is established: MaxTTL is the requested
// session timeout then, so the default TTL is that, and the first Acquire
// succeeds with it.
func TestDefaultTTLRightAfterConnect(t *testing.T) {
	const session = 3 * time.Second
	ctx := locktest.Ctx(t, time.Minute)
	for i := range 3 {
		_, b := connect(t, zkServer.Addr(), session)
		if got := b.MaxTTL(); got != session {
			t.Fatalf("round %d: MaxTTL right after Connect: got %v, want %v", i, got, session)
		}
		c := dlock.New(b)
		l, err := c.Acquire(ctx, locktest.Key(t))
		if err != nil {
			t.Fatalf("round %d: Acquire with the default TTL right after Connect: %v", i, err)
		}
		if got := l.TTL(); got != session {
			t.Errorf("round %d: lease TTL: got %v, want %v", i, got, session)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("round %d: Close: %v", i, err)
		}
	}
}

// TestTTLBelowMinTTL: a TTL below MinTTL is refused by the Backend on
// acquire and on Refresh, with an error matching ErrInvalidTTL.
func TestTTLBelowMinTTL(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	_, b := connect(t, zkServer.Addr(), 2*time.Second)
	short := b.MinTTL() - time.Millisecond
	r := dlock.Request{Key: locktest.Key(t), Token: "t", TTL: short}
	if _, err := b.TryAcquire(ctx, r); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("TryAcquire with TTL %v: got %v, want ErrInvalidTTL", short, err)
	}
	r.TTL = b.MinTTL()
	g, err := b.TryAcquire(ctx, r)
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire with TTL MinTTL: got %+v, %v, want a grant", g, err)
	}
	r.Fence, r.TTL = g.Fence, short
	if err := b.Refresh(ctx, r); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("Refresh to %v: got %v, want ErrInvalidTTL", short, err)
	}
	r.TTL = b.MinTTL()
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestMinTTLMeasure measures what MinTTL rests on: the round trip of a
// renewal (Refresh: one sync) and of an uncontended acquire and release.
// It reports figures only; set ZKLOCK_MEASURE=n for n samples (default
// 200 with -short skipped).
func TestMinTTLMeasure(t *testing.T) {
	n := 200
	if v := os.Getenv("ZKLOCK_MEASURE"); v != "" {
		n, _ = strconv.Atoi(v)
	} else if testing.Short() {
		t.Skip("measurement")
	}
	ctx := locktest.Ctx(t, 5*time.Minute)
	_, b := connect(t, zkServer.Addr(), 2*time.Second)
	r := dlock.Request{Key: locktest.Key(t), Token: "t", TTL: 2 * time.Second}
	var refresh, acquire []time.Duration
	for range n {
		start := time.Now()
		g, err := b.TryAcquire(ctx, r)
		if err != nil || !g.OK {
			t.Fatalf("TryAcquire: %+v, %v", g, err)
		}
		acquire = append(acquire, time.Since(start))
		r.Fence = g.Fence
		start = time.Now()
		if err := b.Refresh(ctx, r); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		refresh = append(refresh, time.Since(start))
		if err := b.Release(ctx, r); err != nil {
			t.Fatalf("Release: %v", err)
		}
		r.Fence = 0
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("load %s", load)
	for _, s := range []struct {
		name string
		d    []time.Duration
	}{{"refresh", refresh}, {"acquire", acquire}} {
		slices.Sort(s.d)
		q := func(p float64) time.Duration { return s.d[int(p*float64(len(s.d)-1))] }
		t.Logf("%s: n=%d p50 %v p99 %v p99.9 %v max %v", s.name, len(s.d), q(0.5), q(0.99), q(0.999), s.d[len(s.d)-1])
	}
}
