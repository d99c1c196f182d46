package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
)

// Hand-off benchmark: benchGoroutines goroutines contend for one key, each
// with its own etcd connection, Backend and Client (like separate
// processes), holding the lock for about benchHold; the result is the
// number of hand-offs to a different goroutine per second over a fixed
// duration, for etcdlock and for the etcd client's own concurrency.Mutex
// in the same run.
//
//	go test -run '^$' -bench Handoff -benchtime 1x -count 5
//
// concurrency.Mutex is capped by etcd's 100 ms catch-up of watches that
// start at an old revision; etcdlock by the CPU and by the etcd server's
// WAL fsync (every hand-off is two writes). TMPDIR=/dev/shm puts the test
// server's data directory on tmpfs, which takes a disk shared with other
// work out of the comparison.
const (
	benchGoroutines = 16
	benchDuration   = 3 * time.Second
	benchHold       = 100 * time.Microsecond
	benchTTL        = 10 * time.Second
)

func BenchmarkHandoff(b *testing.B) {
	b.Run("etcdlock", func(b *testing.B) {
		rate := handoffs(b, etcdlockLocker)
		b.ReportMetric(rate, "handoffs/s")
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		rate := handoffs(b, func(b *testing.B) locker {
			s, err := concurrency.NewSession(newCli(b, srv.Endpoints()), concurrency.WithTTL(int(benchTTL/time.Second)))
			if err != nil {
				b.Fatalf("NewSession: %v", err)
			}
			b.Cleanup(func() { s.Close() })
			return func(ctx context.Context, key string) (func() error, error) {
				m := concurrency.NewMutex(s, "/bench-mutex/"+key)
				if err := m.Lock(ctx); err != nil {
					return nil, err
				}
				return func() error { return m.Unlock(context.WithoutCancel(ctx)) }, nil
			}
		})
		b.ReportMetric(rate, "handoffs/s")
	})
}

// etcdlockLocker returns a locker on its own etcd connection, Backend and
// Client.
func etcdlockLocker(b *testing.B) locker {
	c := dlock.New(etcdlock.New(newCli(b, srv.Endpoints())), dlock.WithTTL(benchTTL))
	b.Cleanup(func() { c.Close() })
	return func(ctx context.Context, key string) (func() error, error) {
		l, err := c.Acquire(ctx, key)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(context.WithoutCancel(ctx)) }, nil
	}
}

// locker takes the lock key and returns its release function.
type locker func(ctx context.Context, key string) (release func() error, err error)

// handoffs runs benchGoroutines goroutines, each with the locker newLocker
// makes for it, on one key for benchDuration and returns hand-offs per
// second. b.N is ignored: each run measures a fixed duration.
func handoffs(b *testing.B, newLocker func(b *testing.B) locker) float64 {
	b.Helper()
	key := uniqueKey(b)
	lockers := make([]locker, benchGoroutines)
	for i := range lockers {
		lockers[i] = newLocker(b)
	}
	var (
		last      atomic.Int32
		handoffs  atomic.Int64
		inside    atomic.Int32
		wg        sync.WaitGroup
		firstErr  error
		errOnce   sync.Once
		acquiries atomic.Int64
	)
	last.Store(-1)
	ctx, cancel := context.WithTimeout(context.Background(), benchDuration)
	defer cancel()
	b.ResetTimer()
	start := time.Now()
	for i := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				release, err := lockers[i](ctx, key)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
						errOnce.Do(func() { firstErr = err })
					}
					return
				}
				if inside.Add(1) != 1 {
					errOnce.Do(func() { firstErr = errors.New("two holders at once") })
				}
				if ctx.Err() == nil {
					acquiries.Add(1)
					if int(last.Swap(int32(i))) != i {
						handoffs.Add(1)
					}
				}
				// Hold: sleep, like work waiting on I/O. (A busy hold takes the
				// CPU from the etcd server on the same machine, on the serial
				// path of every hand-off.)
				time.Sleep(benchHold)
				inside.Add(-1)
				if err := release(); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := min(time.Since(start), benchDuration)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(acquiries.Load())/elapsed.Seconds(), "acquires/s")
	return float64(handoffs.Load()) / elapsed.Seconds()
}
