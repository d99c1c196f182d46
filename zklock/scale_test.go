package zklock_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/scale"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/zklock"
)

// BenchmarkHeldLeases measures the client heap and stack per lease while
// one dlock Client with auto-renewal holds many leases (the bench module's
// scenario S5 in small: 20,000 leases, TTL and session timeout 10 s), on
// zklock and, for comparison, on memlock (the dlock Lease and its watchdog
// bookkeeping with an in-process backend). The figures are the growth of
// the Go heap (after GC) and of the goroutine stacks from before the first
// acquisition to when every lease is held and (zklock) every held node is
// watched, divided by the leases.
//
//	go test -run '^$' -bench HeldLeases -benchtime 1x
//
// ZKLOCK_LEASES sets the number of leases; ZKLOCK_HEAPPROFILE=dir writes
// a heap profile of each sub-benchmark, sampled at every allocation, taken
// while the leases are held (dir/held-<name>.pprof; go tool pprof
// -sample_index=inuse_space).
func BenchmarkHeldLeases(b *testing.B) {
	n := 20000
	if s := os.Getenv("ZKLOCK_LEASES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("ZKLOCK_LEASES=%q: want a positive integer", s)
		}
		n = v
	}
	dir := os.Getenv("ZKLOCK_HEAPPROFILE")
	if dir != "" {
		runtime.MemProfileRate = 1
		defer func() { runtime.MemProfileRate = 512 * 1024 }()
	}
	const ttl = 10 * time.Second
	b.Run("zklock", func(b *testing.B) {
		_, be, err := zklock.Connect([]string{zkServer.Addr()}, ttl, zklock.WithLogger(quiet{}))
		if err != nil {
			b.Fatal(err)
		}
		c := dlock.New(be, dlock.WithTTL(ttl))
		defer c.Close()
		held := func() bool { return be.Unwatched() == 0 }
		benchHeld(b, c, n, held, dir)
	})
	b.Run("memlock", func(b *testing.B) {
		c := dlock.New(memlock.New(), dlock.WithTTL(ttl))
		defer c.Close()
		benchHeld(b, c, n, func() bool { return true }, dir)
	})
}

func benchHeld(b *testing.B, c *dlock.Client, n int, settled func() bool, dir string) {
	prefix := fmt.Sprintf("held-%d-", time.Now().UnixNano())
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%06d", prefix, i)
	}
	leases := make([]*dlock.Lease, n)
	ctx := context.Background()
	warm, err := c.Acquire(ctx, prefix+"warm")
	if err != nil {
		b.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		b.Fatal(err)
	}
	m0 := scale.Sample()
	began := time.Now()
	if err := scale.Each(n, 64, func(i int) (err error) {
		leases[i], err = c.Acquire(ctx, keys[i])
		return err
	}); err != nil {
		b.Fatal(err)
	}
	fill := time.Since(began)
	// Every hold gets its watch watchDelay after its grant: wait for the
	// armer (the last ones were granted a moment ago).
	locktest.WaitFor(b, time.Minute, "every hold watched", settled)
	m1 := scale.Sample()
	if dir != "" {
		f, err := os.Create(fmt.Sprintf("%s/held-%s.pprof", dir, b.Name()[len("BenchmarkHeldLeases/"):]))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	lost := 0
	for _, l := range leases {
		if l.Err() != nil {
			lost++
		}
	}
	heap, stack := scale.PerItem(m0, m1, n)
	b.ReportMetric(heap, "heap-B/lease")
	b.ReportMetric(stack, "stack-B/lease")
	b.ReportMetric(float64(m1.Goroutines-m0.Goroutines), "goroutines")
	b.ReportMetric(fill.Seconds(), "fill-s")
	b.ReportMetric(float64(lost), "lost")
	if err := scale.Each(n, 64, func(i int) error { return leases[i].Release(ctx) }); err != nil {
		b.Error(err)
	}
}
