package redislock_test

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scale"
	"github.com/dlock-go/dlock/redislock"
)

// tripHook records the round trips of a go-redis client: one per
// pipeline, one per single command.
type tripHook struct {
	mu     sync.Mutex
	trips  []trip
	record bool
}

type trip struct {
	at   time.Time
	cmds int
	pipe bool
}

func (h *tripHook) add(n int, pipe bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.record {
		h.trips = append(h.trips, trip{time.Now(), n, pipe})
	}
}

func (h *tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(1, false)
		return next(ctx, cmd)
	}
}
func (h *tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.add(len(cmds), true)
		return next(ctx, cmds)
	}
}

func (h *tripHook) start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips, h.record = nil, true
}

func (h *tripHook) stop() []trip {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.record = false
	return h.trips
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestManyLeasesAutoRenew holds 10,000 leases (1,000 with -race) with one
// Client and the watchdog for 30s (6s with -short) at TTL 3s, so about 30
// (6) renewal ticks happen: none may be lost, all must still be held on
// the server at the end. It logs the round trips per renewal tick (one
// pipeline is one round trip) and the heap in use.
func TestManyLeasesAutoRenew(t *testing.T) {
	const ttl = 3 * time.Second
	n := 10_000
	if raceEnabled {
		// The race detector slows the client about tenfold: a 10,000-lease
		// renewal pipeline then takes longer than a third of the TTL.
		n = 1_000
	}
	hold := 30 * time.Second
	if testing.Short() {
		hold = 6 * time.Second
	}
	hook := &tripHook{}
	rdb := newRDB(t, srv.Addr())
	rdb.AddHook(hook)
	b := redislock.New(rdb)
	c := dlock.New(b, dlock.WithTTL(ttl))
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ctx := ctxT(t, hold+time.Minute)

	heapBefore := heapInUse()
	keys := make([]string, n)
	prefix := key(t)
	for i := range keys {
		keys[i] = prefix + "." + strconv.Itoa(i)
	}
	leases := make([]*dlock.Lease, n)
	start := time.Now()
	parallel(t, n, func(i int) error {
		var err error
		leases[i], err = c.Acquire(ctx, keys[i])
		return err
	})
	if took := time.Since(start); took > ttl/2 {
		t.Logf("acquiring took %v, over half the TTL", took)
	} else {
		t.Logf("acquired %d leases in %v", n, took)
	}
	heapHeld := heapInUse()
	// Make sure the server has the refresh script cached, so the first
	// tick is not a NOSCRIPT fallback (TestScriptFlush covers that).
	if err := leases[0].Refresh(ctx, 0); err != nil {
		t.Fatal(err)
	}

	hook.start()
	holdStart := time.Now()
	timer := time.NewTimer(hold)
	defer timer.Stop()
	for done := false; !done; {
		select {
		case <-timer.C:
			done = true
		case <-leases[0].Done(): // the first-acquired lease renews first
			t.Fatalf("lease lost during the hold: %v", leases[0].Err())
		}
	}
	trips := hook.stop()
	heapEnd := heapInUse()

	lost := 0
	for _, l := range leases {
		select {
		case <-l.Done():
			lost++
		default:
		}
		if l.Err() != nil {
			t.Errorf("lease %q: Err %v", l.Key(), l.Err())
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d leases lost", lost, n)
	}
	// All still held on the server by their owners: one pipeline.
	pipe := rdb.Pipeline()
	owners := make([]*redis.StringCmd, n)
	for i, l := range leases {
		owners[i] = pipe.Get(ctx, b.LockName(l.Key()))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("reading the owners: %v", err)
	}
	for i, l := range leases {
		if got := owners[i].Val(); !strings.HasSuffix(got, ":"+l.Owner()) {
			t.Fatalf("lock %q on the server: owner %q, want %q", l.Key(), got, l.Owner())
		}
	}

	// Renewal ticks: round trips that start within the batch window of
	// one another (TTL/6) belong to one tick.
	var ticks [][]trip
	renewed := 0
	for _, tr := range trips {
		renewed += tr.cmds
		if k := len(ticks); k > 0 && tr.at.Sub(ticks[k-1][0].at) < ttl/6 {
			ticks[k-1] = append(ticks[k-1], tr)
		} else {
			ticks = append(ticks, []trip{tr})
		}
	}
	perTick := make([]int, len(ticks))
	for i, tk := range ticks {
		perTick[i] = len(tk)
	}
	single := 0
	for _, tr := range trips {
		if !tr.pipe {
			single++
		}
	}
	t.Logf("held %d leases for %v (TTL %v): %d renewal ticks, %d round trips (%d pipelines, %d single commands), %d refreshes (%.1f per lease)",
		n, time.Since(holdStart).Round(time.Millisecond), ttl, len(ticks), len(trips), len(trips)-single, single, renewed, float64(renewed)/float64(n))
	if len(perTick) > 0 {
		t.Logf("round trips per tick: min %d, max %d; refreshes per round trip: max %d",
			slices.Min(perTick), slices.Max(perTick), slices.MaxFunc(trips, func(a, b trip) int { return a.cmds - b.cmds }).cmds)
	}
	t.Logf("heap in use: %.1f MiB before, %.1f MiB with %d leases held (%.0f B per lease), %.1f MiB after the hold",
		mib(heapBefore), mib(heapHeld), n, float64(int64(heapHeld)-int64(heapBefore))/float64(n), mib(heapEnd))
	if want := int(hold / (ttl / 3)); len(ticks) < want-2 {
		t.Fatalf("renewal ticks: got %d, want about %d", len(ticks), want)
	}
	// One pipeline per tick; a tick takes two when the leases' renewal
	// times straddle the watchdog's batch window (TTL/6), as after an
	// acquisition phase longer than that.
	if slices.Max(perTick) > 2 {
		t.Fatalf("round trips per tick: got up to %d, want 1 (2 at most)", slices.Max(perTick))
	}
	if len(trips) > len(ticks)+len(ticks)/4 {
		t.Fatalf("round trips: got %d for %d ticks, want about one per tick", len(trips), len(ticks))
	}
	// The watchdog renews every TTL/3, up to TTL/6 early to share a batch.
	if per := float64(renewed) / float64(n); per > float64(hold/(ttl/6))+1 {
		t.Fatalf("refreshes per lease: got %.1f in %v, want one per TTL/3 (%d), at most one per TTL/6", per, hold, hold/(ttl/3))
	}

	parallel(t, n, func(i int) error { return leases[i].Release(ctx) })
	if m := rdb.Exists(ctx, b.LockName(keys[0]), b.LockName(keys[n-1])).Val(); m != 0 {
		t.Fatalf("locks after Release: EXISTS got %d, want 0", m)
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// parallel runs fn(0..n-1) on 32 goroutines and fails the test on the
// first error.
func parallel(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	if err := scale.Each(n, 32, fn); err != nil {
		t.Fatal(err)
	}
}
