package redislock_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/fencedfloor"
	"github.com/dlock-go/dlock/redislock"
)

// Permits and read holds against a raw sorted-set semaphore, in one go:
//
//	go test -run '^$' -bench 'Permit|Read|RawSemaphore' -count 6 ./redislock/

// BenchmarkRawSemaphore is the baseline: fencedfloor.RawSemaphore and a ZREM, with
// a fresh random token per permit: two round trips.
func BenchmarkRawSemaphore(b *testing.B) {
	rdb := newRDB(b, srv.Addr())
	ctx := context.Background()
	keys := []string{key(b)}
	if err := fencedfloor.RawSemaphore.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cost := startCost(b)
	for b.Loop() {
		token := rand.Text()
		if n, err := fencedfloor.RawSemaphore.Run(ctx, rdb, keys, token, 3, 30000).Int(); err != nil || n != 1 {
			b.Fatalf("acquire: %d, %v", n, err)
		}
		if n, err := rdb.ZRem(ctx, keys[0], token).Result(); err != nil || n != 1 {
			b.Fatalf("release: %d, %v", n, err)
		}
	}
	cost.report(b)
}

// BenchmarkBackendPermitCycle is one permit's TryAcquire + Release on the
// Backend, alone on its key: two round trips, as the baseline.
func BenchmarkBackendPermitCycle(b *testing.B) {
	bk := redislock.New(newRDB(b, srv.Addr()))
	b.Cleanup(func() { bk.Close() })
	ctx := context.Background()
	k := key(b)
	b.ReportAllocs()
	cost := startCost(b)
	for b.Loop() {
		r := dlock.Request{Key: k, Token: rand.Text(), TTL: 30 * time.Second, Kind: dlock.KindPermit, Permits: 3}
		g, err := bk.TryAcquire(ctx, r)
		if err != nil || !g.OK {
			b.Fatalf("TryAcquire: %+v, %v", g, err)
		}
		r.Fence = g.Fence
		if err := bk.Release(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	cost.report(b)
}

// BenchmarkPermitCycle is Semaphore.Acquire + Release through a
// dlock.Client with the default options.
func BenchmarkPermitCycle(b *testing.B) {
	c := dlock.New(redislock.New(newRDB(b, srv.Addr())))
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	sem := c.Semaphore(key(b), 3)
	b.ReportAllocs()
	cost := startCost(b)
	for b.Loop() {
		l, err := sem.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	cost.report(b)
}

// BenchmarkReadCycle is RWLock.RLock + Release through a dlock.Client
// with the default options.
func BenchmarkReadCycle(b *testing.B) {
	c := dlock.New(redislock.New(newRDB(b, srv.Addr())))
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	rw := c.RWLock(key(b))
	b.ReportAllocs()
	cost := startCost(b)
	for b.Loop() {
		l, err := rw.RLock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	cost.report(b)
}

// BenchmarkPermitInterleaved alternates, operation by operation, a permit
// through a dlock.Client (Semaphore.Acquire + Release), the Backend's
// TryAcquire + Release of a permit, and the raw sorted-set semaphore
// (BenchmarkRawSemaphore), each on its own key, and reports their mean
// latencies and the ops/s ratios to the raw one measured in the same run
// (×raw for the Client, ×raw-backend for the Backend).
func BenchmarkPermitInterleaved(b *testing.B) {
	rdb := newRDB(b, srv.Addr())
	ctx := context.Background()
	bk := redislock.New(rdb)
	c := dlock.New(bk)
	b.Cleanup(func() { c.Close() })
	k := key(b)
	sem := c.Semaphore(k, 3)
	rawKeys := []string{k + ":raw"}
	if err := fencedfloor.RawSemaphore.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	ops := [3]func(){
		func() {
			l, err := sem.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		},
		func() {
			r := dlock.Request{Key: k + ":backend", Token: rand.Text(), TTL: 30 * time.Second, Kind: dlock.KindPermit, Permits: 3}
			g, err := bk.TryAcquire(ctx, r)
			if err != nil || !g.OK {
				b.Fatalf("TryAcquire: %+v, %v", g, err)
			}
			r.Fence = g.Fence
			if err := bk.Release(ctx, r); err != nil {
				b.Fatal(err)
			}
		},
		func() {
			token := rand.Text()
			if n, err := fencedfloor.RawSemaphore.Run(ctx, rdb, rawKeys, token, 3, 30000).Int(); err != nil || n != 1 {
				b.Fatalf("acquire: %d, %v", n, err)
			}
			if n, err := rdb.ZRem(ctx, rawKeys[0], token).Result(); err != nil || n != 1 {
				b.Fatalf("release: %d, %v", n, err)
			}
		},
	}
	var spent [3]time.Duration
	i := 0
	for b.Loop() {
		for j := range 3 {
			op := (i + j) % 3
			t0 := time.Now()
			ops[op]()
			spent[op] += time.Since(t0)
		}
		i++
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(b.N) / 1e3 }
	b.ReportMetric(us(spent[0]), "dlock-µs")
	b.ReportMetric(us(spent[1]), "backend-µs")
	b.ReportMetric(us(spent[2]), "raw-µs")
	b.ReportMetric(float64(spent[2])/float64(spent[0]), "×raw")
	b.ReportMetric(float64(spent[2])/float64(spent[1]), "×raw-backend")
}
