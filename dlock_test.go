package dlock_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStrategies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		s       dlock.WaitStrategy
		attempt int
		max     time.Duration
		ok      bool
	}{
		{"NoWait", dlock.NoWait(), 1, 0, false},
		{"Constant", dlock.Constant(5 * time.Millisecond), 7, 5 * time.Millisecond, true},
		{"Exponential1", dlock.Exponential(time.Millisecond, time.Second), 1, time.Millisecond, true},
		{"Exponential4", dlock.Exponential(time.Millisecond, time.Second), 4, 8 * time.Millisecond, true},
		{"ExponentialCapped", dlock.Exponential(time.Millisecond, 20*time.Millisecond), 40, 20 * time.Millisecond, true},
		{"LimitWithin", dlock.Limit(3, dlock.Constant(time.Millisecond)), 2, time.Millisecond, true},
		{"LimitExhausted", dlock.Limit(3, dlock.Constant(time.Millisecond)), 3, 0, false},
		// No cap: the doubling stops at the maximum instead of overflowing.
		{"ExponentialUncapped35", dlock.Exponential(time.Second, math.MaxInt64), 35, math.MaxInt64, true},
		{"ExponentialUncapped64", dlock.Exponential(time.Second, math.MaxInt64), 64, math.MaxInt64, true},
		{"ExponentialUncapped1000", dlock.Exponential(time.Second, math.MaxInt64), 1000, math.MaxInt64, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < 200; i++ {
				d, ok := tc.s.Delay(tc.attempt)
				if ok != tc.ok {
					t.Fatalf("Delay(%d) ok: got %v, want %v", tc.attempt, ok, tc.ok)
				}
				if d < 0 || d > tc.max || (ok && d == 0) {
					t.Fatalf("Delay(%d): got %v, want in (0, %v]", tc.attempt, d, tc.max)
				}
			}
		})
	}
}

// TestWaitStrategyErrors: an invalid strategy is refused with an error
// that names the rule it breaks.
func TestWaitStrategyErrors(t *testing.T) {
	for _, tc := range []struct {
		s    dlock.WaitStrategy
		want string
	}{
		{nil, "nil strategy"},
		{dlock.Constant(0), "Constant(0s): the delay must be positive"},
		{dlock.Exponential(0, time.Second), "Exponential(0s, 1s): the base must be positive"},
		{dlock.Exponential(10*time.Millisecond, time.Microsecond), "Exponential(10ms, 1µs): the maximum must be at least the base"},
		{dlock.Limit(0, dlock.NoWait()), "Limit(0, …): at least 1 attempt"},
		{dlock.Limit(2, dlock.Constant(-time.Second)), "Limit(2, …): Constant(-1s): the delay must be positive"},
	} {
		c := dlock.New(memlock.New(), dlock.WithWait(tc.s))
		err := c.Err()
		if !errors.Is(err, dlock.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("WithWait: got %v, want ErrInvalidOption saying %q", err, tc.want)
		}
		c.Close()
	}
}

// TestFIFOPatienceOverflow: a FIFO wait whose strategy's delays add up to
// more than a Duration holds waits until the context ends, as a strategy
// that waits forever, instead of giving up at once.
func TestFIFOPatienceOverflow(t *testing.T) {
	ctx := context.Background()
	b := memlock.New()
	holder := dlock.New(b)
	defer holder.Close()
	l, err := holder.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	c := dlock.New(b, dlock.WithWait(dlock.Limit(3, dlock.Constant(math.MaxInt64))))
	defer c.Close()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(short, "k", dlock.WithFIFO()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("FIFO wait with Limit(3, Constant(MaxInt64)): got %v, want the context's deadline", err)
	}
}

// TestExponentialJitter checks that full jitter spreads delays over the
// whole interval rather than returning the ceiling.
func TestExponentialJitter(t *testing.T) {
	s := dlock.Exponential(time.Millisecond, time.Second)
	var low, high int
	for i := 0; i < 1000; i++ {
		d, _ := s.Delay(5) // ceiling 16ms
		if d < 4*time.Millisecond {
			low++
		}
		if d > 12*time.Millisecond {
			high++
		}
	}
	if low < 150 || high < 150 {
		t.Fatalf("jitter not uniform over [0,16ms]: %d below 4ms, %d above 12ms of 1000", low, high)
	}
}

func TestInvalidOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    *dlock.Client
		want error
	}{
		{"NilBackend", dlock.New(nil), dlock.ErrInvalidOption},
		{"TTL", dlock.New(memlock.New(), dlock.WithTTL(0)), dlock.ErrInvalidTTL},
		{"ConstantZero", dlock.New(memlock.New(), dlock.WithWait(dlock.Constant(0))), dlock.ErrInvalidOption},
		{"ExponentialInverted", dlock.New(memlock.New(), dlock.WithWait(dlock.Exponential(time.Second, time.Millisecond))), dlock.ErrInvalidOption},
		{"LimitZero", dlock.New(memlock.New(), dlock.WithWait(dlock.Limit(0, dlock.NoWait()))), dlock.ErrInvalidOption},
		{"ReleaseTimeout", dlock.New(memlock.New(), dlock.WithReleaseTimeout(-1)), dlock.ErrInvalidOption},
		{"NilOption", dlock.New(memlock.New(), nil), dlock.ErrInvalidOption},
		{"NilOnLost", dlock.New(memlock.New(), dlock.WithOnLost(nil)), dlock.ErrInvalidOption},
		{"LongOwner", dlock.New(memlock.New(), dlock.WithOwner(strings.Repeat("o", dlock.MaxKeyLen+1))), dlock.ErrInvalidOption},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Err(); !errors.Is(err, tc.want) {
				t.Fatalf("Err: got %v, want %v", err, tc.want)
			}
			_, err := tc.c.Acquire(context.Background(), "k")
			if !errors.Is(err, tc.want) {
				t.Fatalf("Acquire: got %v, want %v", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "dlock: ") {
				t.Fatalf("error %q does not start with \"dlock: \"", err)
			}
		})
	}
}

func TestAcquireErrorMessages(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithWait(dlock.Limit(3, dlock.Constant(time.Millisecond))))
	ctx := context.Background()
	l := locktest.MustAcquire(t, ctx, c, "busy")
	defer l.Release(ctx)
	_, err := c.Acquire(ctx, "busy")
	var ae *dlock.AcquireError
	if !errors.As(err, &ae) || ae.Attempts != 3 || ae.Cause != nil {
		t.Fatalf("gave up: got %#v, want AcquireError with 3 attempts and no cause", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("gave up: %v must not match a context error", err)
	}
	want := `dlock: lock "busy" not acquired after 3 attempts: held by another owner, wait strategy gave up`
	if err.Error() != want {
		t.Fatalf("message: got %q, want %q", err, want)
	}
}

func TestFIFOUnsupported(t *testing.T) {
	c := dlock.New(noQueue{memlock.New()}, dlock.WithFIFO())
	_, err := c.Acquire(context.Background(), "k")
	if !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("WithFIFO on a backend without a queue: got %v, want ErrInvalidOption", err)
	}
}

// noQueue hides memlock's optional capabilities, leaving the bare Backend.
type noQueue struct{ dlock.Backend }

// counting wraps memlock and counts calls, to check how the watchdog
// batches renewals.
type counting struct {
	*memlock.Backend
	batches, refreshes, renewed atomic.Int64
}

func (c *counting) Refresh(ctx context.Context, r dlock.Request) error {
	c.refreshes.Add(1)
	c.renewed.Add(1)
	return c.Backend.Refresh(ctx, r)
}

func (c *counting) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	c.batches.Add(1)
	c.renewed.Add(int64(len(rs)))
	return c.Backend.RefreshMany(ctx, rs)
}

// slowBatch is a memlock Backend whose RefreshMany takes per for each
// lease (in the bubble's virtual time) and renews none when its context
// ends first, as a batch on a busy server does.
type slowBatch struct {
	*memlock.Backend
	per   time.Duration
	calls atomic.Int64
}

func (s *slowBatch) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	s.calls.Add(1)
	t := time.NewTimer(time.Duration(len(rs)) * s.per)
	defer t.Stop()
	select {
	case <-t.C:
		return s.Backend.RefreshMany(ctx, rs)
	case <-ctx.Done():
		errs := make([]error, len(rs))
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
}

// TestWatchdogLargeBatchChunks: a batch of 40,000 renewals that needs more
// than its deadline (TTL/3) as one call is sent in chunks, so the chunks
// that fit are renewed and the rest retried: no lease is lost over five
// TTLs, though the backend renews a call's leases all or none.
func TestWatchdogLargeBatchChunks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, ttl = 40_000, 3 * time.Second
		b := &slowBatch{Backend: memlock.New(), per: 30 * time.Microsecond} // one call of n: 1.2s > TTL/3
		c := dlock.New(b, dlock.WithTTL(ttl))
		defer c.Close()
		ctx := context.Background()
		leases := make([]*dlock.Lease, n)
		for i := range leases {
			leases[i] = locktest.MustAcquire(t, ctx, c, "k"+strconv.Itoa(i))
		}
		time.Sleep(5 * ttl)
		lost := 0
		for _, l := range leases {
			if l.Err() != nil {
				lost++
			}
		}
		if lost > 0 {
			t.Fatalf("%d of %d leases lost over %v (%d RefreshMany calls)", lost, n, 5*ttl, b.calls.Load())
		}
	})
}

// TestWatchdogBatches holds many leases and checks that renewals are
// batched: far fewer calls than leases renewed.
func TestWatchdogBatches(t *testing.T) {
	synctest.Test(t, testWatchdogBatches)
}

func testWatchdogBatches(t *testing.T) {
	b := &counting{Backend: memlock.New()}
	const n, ttl = 500, time.Second
	c := dlock.New(b, dlock.WithTTL(ttl))
	defer c.Close()
	ctx := context.Background()
	leases := make([]*dlock.Lease, n)
	for i := range leases {
		l, err := c.Acquire(ctx, "batch-"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('A'+i/26)))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	time.Sleep(5 * ttl)
	synctest.Wait()
	for _, l := range leases {
		if err := l.Err(); err != nil {
			t.Fatalf("lease %s lost: %v", l.Key(), err)
		}
	}
	renewed, calls := b.renewed.Load(), b.batches.Load()+b.refreshes.Load()
	t.Logf("%d renewals in %d calls over 5×TTL", renewed, calls)
	if renewed < int64(n)*10 {
		t.Fatalf("renewals: got %d, want ≥ %d (every lease about every TTL/3)", renewed, n*10)
	}
	if calls*50 > renewed {
		t.Fatalf("calls: got %d for %d renewals, want batches of ≥ 50 on average", calls, renewed)
	}
}

// hangKey is a memlock Backend whose renewals of one key never answer: a
// call or batch that has the key blocks until its context ends, as on a
// connection to a server that stopped answering. hung, if not nil, is
// closed when the first such call starts to hang.
type hangKey struct {
	*memlock.Backend
	key  string
	hang atomic.Bool
	hung chan struct{}
	once sync.Once
}

func (h *hangKey) blocks(ctx context.Context, rs ...dlock.Request) error {
	for _, r := range rs {
		if h.hang.Load() && (h.key == "" || r.Key == h.key) {
			if h.hung != nil {
				h.once.Do(func() { close(h.hung) })
			}
			<-ctx.Done()
			return ctx.Err()
		}
	}
	return nil
}

func (h *hangKey) Refresh(ctx context.Context, r dlock.Request) error {
	if err := h.blocks(ctx, r); err != nil {
		return err
	}
	return h.Backend.Refresh(ctx, r)
}

func (h *hangKey) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	if err := h.blocks(ctx, rs...); err != nil {
		errs := make([]error, len(rs))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	return h.Backend.RefreshMany(ctx, rs)
}

// TestWatchdogHungRenewalIsolated: a renewal that hangs (a lease of 30s
// whose renewal batch may take TTL/3) neither delays another lease's
// renewals nor, when the server answers nothing at all, its loss past
// its Expires.
func TestWatchdogHungRenewalIsolated(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  string // the renewals that hang: "a", or every one
	}{{"OtherRenewed", "a"}, {"LostAtExpires", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &hangKey{Backend: memlock.New(), key: tc.key, hung: make(chan struct{})}
				b.hang.Store(true)
				c := dlock.New(b)
				defer c.Close()
				ctx := context.Background()
				if _, err := c.Acquire(ctx, "a", dlock.WithTTL(30*time.Second)); err != nil {
					t.Fatal(err)
				}
				<-b.hung // a's renewal, due at TTL/3 (10s), hangs: b's renewals come while it does
				bl, err := c.Acquire(ctx, "b", dlock.WithTTL(600*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				if tc.key != "" {
					time.Sleep(3 * time.Second)
					if err := bl.Err(); err != nil || !bl.Expires().After(time.Now()) {
						t.Fatalf("b while a's renewal hangs: err %v, expires %v ago", err, time.Since(bl.Expires()))
					}
					return
				}
				expires := bl.Expires()
				select {
				case <-bl.Done():
					if d := time.Since(expires); d > time.Millisecond {
						t.Fatalf("b lost %v after its Expires", d)
					}
				case <-time.After(time.Until(expires) + time.Second):
					t.Fatalf("b not lost 1s after its Expires (a's renewal in flight)")
				}
				b.hang.Store(false)
			})
		})
	}
}

// TestWatchdogHungRenewalNoBatch: on a backend without RefreshMany the
// leases of one batch are renewed by separate calls; one that hangs must
// not use up the others' time.
func TestWatchdogHungRenewalNoBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &hangKey{Backend: memlock.New(), key: "a"}
		c := dlock.New(struct{ dlock.Backend }{h}, dlock.WithTTL(3*time.Second))
		defer c.Close()
		ctx := context.Background()
		var leases []*dlock.Lease
		for _, k := range []string{"a", "b", "c"} {
			l, err := c.Acquire(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, l)
		}
		h.hang.Store(true)
		time.Sleep(10 * time.Second)
		for _, l := range leases[1:] {
			if err := l.Err(); err != nil || !l.Expires().After(time.Now()) {
				t.Fatalf("%s while a's renewal hangs: err %v, expires in %v", l.Key(), err, time.Until(l.Expires()))
			}
		}
		if leases[0].Err() == nil {
			t.Fatal("a: renewals hung past its expiry, yet not lost")
		}
		h.hang.Store(false)
	})
}

// gatedRefresh is a Backend without RefreshMany whose Refresh calls wait
// until gate is closed, counting the calls in flight and their peak;
// entered is closed when the first call starts.
type gatedRefresh struct {
	dlock.Backend
	peak    locktest.Peak
	entered chan struct{}
	once    sync.Once
	gate    chan struct{}
}

func (g *gatedRefresh) Refresh(ctx context.Context, r dlock.Request) error {
	g.peak.Enter()
	defer g.peak.Leave()
	g.once.Do(func() { close(g.entered) })
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Backend.Refresh(ctx, r)
}

// TestWatchdogRefreshCallsBounded: on a backend without RefreshMany a
// batch of 600 leases runs its Refresh calls concurrently, 256 at once at
// most, and every lease is renewed.
func TestWatchdogRefreshCallsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &gatedRefresh{Backend: memlock.New(), entered: make(chan struct{}), gate: make(chan struct{})}
		c := locktest.Closing(t, dlock.New(b, dlock.WithTTL(3*time.Second)))
		ctx := context.Background()
		const n = 600
		leases := make([]*dlock.Lease, n)
		first := make([]time.Time, n) // the expiry of each lease's acquisition
		for i := range leases {
			leases[i] = locktest.MustAcquire(t, ctx, c, "k"+strconv.Itoa(i))
			first[i] = leases[i].Expires()
		}
		<-b.entered     // the renewal round, at TTL/3, has begun
		synctest.Wait() // and started every call it runs at once
		if p := b.peak.Most(); p != 256 {
			t.Fatalf("Refresh calls at once: got %d, want 256 (the bound)", p)
		}
		close(b.gate)
		synctest.Wait() // the round is over
		for i, l := range leases {
			if l.Err() != nil || !l.Expires().After(first[i]) {
				t.Fatalf("%s not renewed: err %v, expires %v after its acquisition's expiry", l.Key(), l.Err(), l.Expires().Sub(first[i]))
			}
		}
	})
}

// TestLostOnTakeover deletes the lock behind the holder's back (another
// connection releasing with the holder's token): the next renewal finds
// it gone and reports the lease lost at once.
func TestLostOnTakeover(t *testing.T) {
	synctest.Test(t, testLostOnTakeover)
}

func testLostOnTakeover(t *testing.T) {
	store := memlock.NewStore()
	ttl := 300 * time.Millisecond
	var lostCause atomic.Value
	c := dlock.New(store.Backend(), dlock.WithTTL(ttl), dlock.WithOnLost(func(_ *dlock.Lease, err error) { lostCause.Store(err) }))
	defer c.Close()
	ctx := context.Background()
	l := locktest.MustAcquire(t, ctx, c, "k")
	work, cancel := l.Context(ctx)
	defer cancel()
	if err := store.Backend().Release(ctx, dlock.Request{Key: "k", Token: l.Owner()}); err != nil {
		t.Fatal(err)
	}
	oc := dlock.New(store.Backend())
	defer oc.Close()
	other, err := oc.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(ttl):
		t.Fatal("lease not reported lost after its renewal found another holder")
	}
	if !errors.Is(l.Err(), dlock.ErrLost) || !errors.Is(l.Err(), dlock.ErrNotHeld) {
		t.Fatalf("Err: got %v, want ErrLost and ErrNotHeld", l.Err())
	}
	if !errors.Is(context.Cause(work), dlock.ErrLost) {
		t.Fatalf("Context cause: got %v, want ErrLost", context.Cause(work))
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Release of lost lease: got %v, want ErrLost", err)
	}
	if other.Err() != nil {
		t.Fatalf("new holder disturbed: %v", other.Err())
	}
	synctest.Wait() // OnLost runs on its own goroutine
	if err, _ := lostCause.Load().(error); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("OnLost cause: got %v, want ErrLost", err)
	}
}

// TestReentryAfterLoss: a reentrant owner whose hold was lost must get
// ErrLost, not a silent fresh lock.
func TestReentryAfterLoss(t *testing.T) {
	synctest.Test(t, testReentryAfterLoss)
}

func testReentryAfterLoss(t *testing.T) {
	store := memlock.NewStore()
	c := dlock.New(store.Backend(), dlock.WithOwner("job-7"), dlock.WithTTL(50*time.Millisecond), dlock.WithAutoRenew(false))
	defer c.Close()
	ctx := context.Background()
	l := locktest.MustAcquire(t, ctx, c, "k")
	<-l.Done()
	if _, err := c.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("re-entry after loss: got %v, want ErrLost", err)
	}
	l.Release(ctx)
	l2, err := c.Acquire(ctx, "k") // after the lost lease is released, a fresh hold is fine
	if err != nil {
		t.Fatalf("acquire after releasing the lost lease: %v", err)
	}
	l2.Release(ctx)
}

func TestCloseReleases(t *testing.T) {
	store := memlock.NewStore()
	c := dlock.New(store.Backend())
	ctx := context.Background()
	l := locktest.MustAcquire(t, ctx, c, "k")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), dlock.ErrReleased) {
		t.Fatalf("lease after Close: got %v, want ErrReleased", l.Err())
	}
	if _, err := c.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Acquire after Close: got %v, want ErrClosed", err)
	}
	assertFree(t, locktest.Closing(t, dlock.New(store.Backend())), "k", "after Close")
}

func TestLeaseConcurrentUse(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithTTL(50*time.Millisecond))
	defer c.Close()
	ctx := context.Background()
	l := locktest.MustAcquire(t, ctx, c, "k")
	var wg sync.WaitGroup
	var released atomic.Int32
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 50; j++ {
				_ = l.Expires()
				_ = l.Err()
				_ = l.Refresh(ctx, 0)
				cctx, cancel := l.Context(ctx)
				_ = cctx
				cancel()
			}
			if l.Release(ctx) == nil {
				released.Add(1)
			}
		}()
	}
	wg.Wait()
	if released.Load() != 1 {
		t.Fatalf("successful concurrent Releases: got %d, want 1", released.Load())
	}
}

func TestExpiresBound(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Second))
	defer c.Close()
	before := time.Now()
	l := locktest.MustAcquire(t, context.Background(), c, "k")
	defer l.Release(context.Background())
	// invoke ≥ before, so Expires ≤ invoke + TTL − drift must hold for
	// some invoke in [before, now].
	latest := time.Now().Add(time.Second - 12*time.Millisecond)
	if l.Expires().After(latest) || l.Expires().Before(before.Add(900*time.Millisecond)) {
		t.Fatalf("Expires: got +%v, want ≤ invoke + TTL − drift (+%v at most)", l.Expires().Sub(before), latest.Sub(before))
	}
}

func TestAcquireMany(t *testing.T) {
	store := memlock.NewStore()
	ctx := context.Background()
	c := dlock.New(store.Backend())
	defer c.Close()
	ls, err := c.AcquireMany(ctx, []string{"order:2", "order:1"})
	if err != nil {
		t.Fatal(err)
	}
	if ls[0].Key() != "order:2" || ls[1].Key() != "order:1" {
		t.Fatalf("lease order: got %s, %s; want order:2, order:1", ls[0].Key(), ls[1].Key())
	}
	// A partly overlapping set waits, then fails on its deadline, and
	// leaves nothing of its own held.
	other := dlock.New(store.Backend())
	defer other.Close()
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := other.AcquireMany(tctx, []string{"order:0", "order:1"}); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("overlapping AcquireMany: got %v, want ErrNotAcquired", err)
	}
	assertFree(t, other, "order:0", "after a failed AcquireMany")
	for _, l := range ls {
		l.Release(ctx)
	}
	for _, tc := range []struct {
		name string
		keys []string
	}{{"none", nil}, {"duplicate", []string{"a", "b", "a"}}, {"empty", []string{"a", ""}}} {
		if _, err := c.AcquireMany(ctx, tc.keys); !errors.Is(err, dlock.ErrInvalidKey) {
			t.Fatalf("AcquireMany %s: got %v, want ErrInvalidKey", tc.name, err)
		}
	}
}

// TestAcquireManyNoDeadlock: goroutines with random overlapping key sets
// all finish.
func TestAcquireManyNoDeadlock(t *testing.T) {
	store := memlock.NewStore()
	keys := []string{"a", "b", "c", "d", "e"}
	var wg sync.WaitGroup
	var done atomic.Int64
	for g := 0; g < 8; g++ {
		c := dlock.New(store.Backend())
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				set := []string{keys[(g+i)%5], keys[(g*3+i+1)%5], keys[(i+2)%5]}
				set = slices.Compact(slices.Sorted(slices.Values(set)))
				slices.Reverse(set)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				ls, err := c.AcquireMany(ctx, set)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				for _, l := range ls {
					l.Release(context.Background())
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if done.Load() != 8*50 {
		t.Fatalf("completed: got %d, want %d", done.Load(), 8*50)
	}
}

type limited struct {
	*memlock.Backend
	max time.Duration
}

func (l limited) MaxTTL() time.Duration { return l.max }

func TestTTLLimiterDefault(t *testing.T) {
	ctx := context.Background()
	c := dlock.New(limited{memlock.New(), 5 * time.Second})
	defer c.Close()
	l := locktest.MustAcquire(t, ctx, c, "k")
	defer l.Release(ctx)
	if l.TTL() != 5*time.Second {
		t.Fatalf("TTL without WithTTL on a backend limited to 5s: got %v, want 5s", l.TTL())
	}
	c2 := dlock.New(limited{memlock.New(), 5 * time.Second}, dlock.WithTTL(2*time.Second))
	defer c2.Close()
	l2 := locktest.MustAcquire(t, ctx, c2, "k")
	defer l2.Release(ctx)
	if l2.TTL() != 2*time.Second {
		t.Fatalf("explicit TTL: got %v, want 2s", l2.TTL())
	}
}

// TestZeroValues: a nil or zero Client, a nil Lease and an Election of
// either return errors that say so (or, for Observe, a closed channel),
// never panic.
func TestZeroValues(t *testing.T) {
	ctx := context.Background()
	for name, c := range map[string]*dlock.Client{"nil": nil, "zero": new(dlock.Client)} {
		t.Run(name, func(t *testing.T) {
			if err := c.Err(); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("Err: got %v, want ErrInvalidOption", err)
			}
			if _, err := c.Acquire(ctx, "k"); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("Acquire: got %v, want ErrInvalidOption", err)
			}
			if _, err := c.AcquireMany(ctx, []string{"k"}); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("AcquireMany: got %v, want ErrInvalidOption", err)
			}
			if _, err := c.Semaphore("k", 2).Acquire(ctx); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("Semaphore.Acquire: got %v, want ErrInvalidOption", err)
			}
			e := c.Election("k")
			if _, err := e.Campaign(ctx, "v"); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("Campaign: got %v, want ErrInvalidOption", err)
			}
			if _, ok := <-e.Observe(ctx); ok {
				t.Error("Observe: got a leader, want the channel closed")
			}
			if err := c.Close(); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Errorf("Close: got %v, want ErrInvalidOption", err)
			}
		})
	}
	var l *dlock.Lease
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Release of a nil Lease: got %v, want ErrInvalidOption", err)
	}
	if err := l.Refresh(ctx, 0); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("Refresh of a nil Lease: got %v, want ErrInvalidOption", err)
	}
}

// inspectCount is a memlock Backend that counts its Inspect calls (an
// election's readings of its leader).
type inspectCount struct {
	*memlock.Backend
	n atomic.Int64
}

func (b *inspectCount) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	b.n.Add(1)
	return b.Backend.Inspect(ctx, key)
}

// TestObserveEndsAtClose: Observe's channel closes when the Client is
// closed, not only when its context ends, also while a reading of the
// leader hangs.
func TestObserveEndsAtClose(t *testing.T) {
	for _, frozen := range []bool{false, true} {
		t.Run(map[bool]string{false: "Answering", true: "Frozen"}[frozen], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := memlock.NewStore()
				defer s.Resume()
				b := &inspectCount{Backend: s.Backend()}
				c := dlock.New(b)
				ch := c.Election("k").Observe(context.Background())
				if l, ok := <-ch; !ok || l != (dlock.Leader{}) {
					t.Fatalf("first observation: got %+v, %v; want no leader", l, ok)
				}
				if frozen { // the next reading of the leader does not answer
					s.Pause()
					locktest.WaitFor(t, 2*time.Second, "the next reading of the leader", func() bool { return b.n.Load() >= 2 })
					synctest.Wait() // it hangs on the paused store
				}
				c.Close()
				for range ch {
				}
			})
		})
	}
}

// assertHeld fails the test unless key is held elsewhere: c cannot take
// it at once. when says at which point of the test, for the message.
func assertHeld(t *testing.T, c *dlock.Client, key, when string) {
	t.Helper()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, key)
	if err == nil {
		l.Release(ctx)
	}
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire(%q) %s: got %v, want ErrNotAcquired", key, when, err)
	}
}

// assertFree fails the test unless c takes key at once; it releases it
// again. when says at which point of the test, for the message.
func assertFree(t *testing.T, c *dlock.Client, key, when string) {
	t.Helper()
	ctx := context.Background()
	l, err := c.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire(%q) %s: %v, want the lock free", key, when, err)
	}
	l.Release(ctx)
}

// freedAt, in a synctest bubble, queues c for key (FIFO: the head of the
// queue is served the moment the lock is freed or expires) and returns
// the virtual time it was granted at, releasing it again. It fails the
// test if key is not granted within d.
func freedAt(t *testing.T, c *dlock.Client, key string, d time.Duration) time.Time {
	t.Helper()
	l, err := c.Acquire(locktest.Ctx(t, d), key, dlock.WithFIFO())
	if err != nil {
		t.Fatalf("Acquire(%q), waiting up to %v: %v", key, d, err)
	}
	at := time.Now()
	l.Release(context.Background())
	return at
}
