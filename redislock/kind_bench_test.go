package redislock_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	costLoop(b, rawSemaphoreCycle(b, newRDB(b, srv.Addr()), key(b)))
}

// BenchmarkBackendPermitCycle is one permit's TryAcquire + Release on the
// Backend, alone on its key: two round trips, as the baseline.
func BenchmarkBackendPermitCycle(b *testing.B) {
	bk := redislock.New(newRDB(b, srv.Addr()))
	b.Cleanup(func() { bk.Close() })
	costLoop(b, permitCycle(b, bk, key(b)))
}

// BenchmarkPermitCycle is Semaphore.Acquire + Release through a
// dlock.Client with the default options.
func BenchmarkPermitCycle(b *testing.B) {
	c := newBenchClient(b, newRDB(b, srv.Addr()))
	costLoop(b, cycle(b, context.Background(), c.Semaphore(key(b), 3).Acquire))
}

// BenchmarkReadCycle is RWLock.RLock + Release through a dlock.Client
// with the default options.
func BenchmarkReadCycle(b *testing.B) {
	c := newBenchClient(b, newRDB(b, srv.Addr()))
	costLoop(b, cycle(b, context.Background(), c.RWLock(key(b)).RLock))
}

// BenchmarkPermitInterleaved alternates, operation by operation, a permit
// through a dlock.Client (Semaphore.Acquire + Release), the Backend's
// TryAcquire + Release of a permit, and the raw sorted-set semaphore
// (BenchmarkRawSemaphore), each on its own key, and reports their mean
// latencies and the ops/s ratios to the raw one measured in the same run
// (×raw for the Client, ×raw-backend for the Backend).
func BenchmarkPermitInterleaved(b *testing.B) {
	rdb := newRDB(b, srv.Addr())
	bk := redislock.New(rdb)
	c := dlock.New(bk)
	b.Cleanup(func() { c.Close() })
	k := key(b)
	us := interleave(b,
		cycle(b, context.Background(), c.Semaphore(k, 3).Acquire),
		permitCycle(b, bk, k+":backend"),
		rawSemaphoreCycle(b, rdb, k+":raw"))
	b.ReportMetric(us[0], "dlock-µs")
	b.ReportMetric(us[1], "backend-µs")
	b.ReportMetric(us[2], "raw-µs")
	b.ReportMetric(us[2]/us[0], "×raw")
	b.ReportMetric(us[2]/us[1], "×raw-backend")
}

// permitCycle returns the Backend's TryAcquire and Release of one of 3
// permits of the key k, with a fresh random token.
func permitCycle(b *testing.B, bk *redislock.Backend, k string) func() {
	return func() {
		r := dlock.Request{Key: k, Token: rand.Text(), TTL: 30 * time.Second, Kind: dlock.KindPermit, Permits: 3}
		tryRelease(b, context.Background(), bk, r)
	}
}

// rawSemaphoreCycle returns the raw semaphore on the key k:
// fencedfloor.RawSemaphore with 3 permits and a fresh random token, then
// a ZREM.
func rawSemaphoreCycle(b *testing.B, rdb *redis.Client, k string) func() {
	ctx := context.Background()
	if err := fencedfloor.RawSemaphore.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	keys := []string{k}
	return func() {
		token := rand.Text()
		if n, err := fencedfloor.RawSemaphore.Run(ctx, rdb, keys, token, 3, 30000).Int(); err != nil || n != 1 {
			b.Fatalf("acquire: %d, %v", n, err)
		}
		if n, err := rdb.ZRem(ctx, k, token).Result(); err != nil || n != 1 {
			b.Fatalf("release: %d, %v", n, err)
		}
	}
}
