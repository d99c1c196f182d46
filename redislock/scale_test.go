package redislock_test

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/scale"
	"github.com/dlock-go/dlock/redislock"
)

// The backend at scale: many leases renewed by one watchdog
// (TestManyLeasesAutoRenew) and many keys that must not stay behind
// (TestNoKeysLeftBehind).

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
	rdb.AddHook(hookFunc(hook.add))
	// Through the pool, whose round trips the hook sees (TestRefreshManyOneWrite
	// checks the Backend's own connection).
	b := redislock.New(rdb, redislock.WithClientPool())
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

	for _, l := range leases {
		if l.Err() != nil {
			t.Errorf("lease %q: Err %v", l.Key(), l.Err())
		}
	}
	if lost := locktest.Lost(leases); lost > 0 {
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

// usedMemory returns INFO memory's used_memory.
func usedMemory(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory")
	return 0
}

// TestNoKeysLeftBehind locks and releases 100,000 distinct keys (10,000
// with -short), some of them with waiters queued, and checks that DBSIZE
// is back at its starting value: at once for released locks, and within
// twice the waiter TTL (plus 60s of slack) for queues. It reports
// used_memory per held lock.
func TestNoKeysLeftBehind(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	// Long enough to hold every lock while the others are taken (-race).
	const ttl = 10 * time.Minute
	// A database of its own: DBSIZE counts only this test's keys.
	rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.DB = 7; o.PoolSize = 32 })
	b := newBackend(t, rdb)
	ctx := ctxT(t, 5*time.Minute)
	start := rdb.DBSize(ctx).Val()
	m0 := usedMemory(t, rdb)
	prefix := key(t) + ":"
	reqs := make([]dlock.Request, n)
	for i := range reqs {
		reqs[i] = req(prefix+strconv.Itoa(i), ttl)
	}
	if err := scale.Each(n, 32, func(i int) error {
		_, err := b.TryAcquire(ctx, reqs[i])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	held := rdb.DBSize(ctx).Val() - start
	m1 := usedMemory(t, rdb)
	t.Logf("%d locks held: %d keys, used_memory %.0f bytes per lock (load %s)", n, held, float64(m1-m0)/float64(n), scale.LoadAvg())
	if held != int64(n) {
		t.Fatalf("keys while %d locks are held: got %d, want one per lock", n, held)
	}
	if err := scale.Each(n, 32, func(i int) error { return b.Release(ctx, reqs[i]) }); err != nil {
		t.Fatal(err)
	}
	if got := rdb.DBSize(ctx).Val(); got != start {
		t.Fatalf("DBSIZE after the releases: got %d, want %d", got, start)
	}

	// Contended keys: waiters queue, the holders release, everything
	// expires within twice the waiter TTL.
	c := dlock.New(b, dlock.WithTTL(ttl))
	t.Cleanup(func() { c.Close() })
	for i := 0; i < 20; i++ {
		k := prefix + "q" + strconv.Itoa(i)
		h := mustAcquire(t, ctx, c, k)
		w := startAcquire(c, ctx, k)
		waitFor(t, 5*time.Second, "the waiter to queue", func() bool { return rdb.Exists(ctx, b.LockName(k)+":q").Val() == 1 })
		release(t, ctx, h)
		if err := w.lease(t, 5*time.Second, "waiter").Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Queues expire twice the waiter TTL after their last step, within
	// the documented bound.
	waitFor(t, 2*redislock.DefaultWaiterTTL+60*time.Second, "DBSIZE back to its start", func() bool { return rdb.DBSize(ctx).Val() == start })
}
