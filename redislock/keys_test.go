package redislock_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scale"
	"github.com/dlock-go/dlock/redislock"
)

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
		h, err := c.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		w := startAcquire(c, ctx, k)
		waitFor(t, 5*time.Second, "the waiter to queue", func() bool { return rdb.Exists(ctx, b.LockName(k)+":q").Val() == 1 })
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.lease(t, 5*time.Second, "waiter").Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Queues expire twice the waiter TTL after their last step, within
	// the documented bound.
	waitFor(t, 2*redislock.DefaultWaiterTTL+60*time.Second, "DBSIZE back to its start", func() bool { return rdb.DBSize(ctx).Val() == start })
}
