package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	store := memlock.NewStore()
	dlocktest.Run(t, dlocktest.Harness{
		NewBackend: func(*testing.T) dlock.Backend { return store.Backend() },
		TTL:        200 * time.Millisecond,
		FIFO:       true,
		Outage: func(*testing.T) func() {
			store.Pause()
			return store.Resume
		},
	})
}

// TestFIFOOrder queues waiters in a known order and checks they are
// served in exactly that order.
func TestFIFOOrder(t *testing.T) {
	store := memlock.NewStore()
	ctx := context.Background()
	holder, err := dlock.New(store.Backend()).Acquire(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		c := dlock.New(store.Backend(), dlock.WithFIFO())
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(ctx, "q")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			l.Release(ctx)
		}()
		// Await this waiter's arrival in the queue before starting the next.
		waitQueued(t, store, "q", i+1)
	}
	holder.Release(ctx)
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("grant order: got %v, want 0..%d in order", order, n-1)
		}
	}
}

func waitQueued(t *testing.T, s *memlock.Store, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.QueueLen(key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue length of %q: got %d, want %d", key, s.QueueLen(key), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestClosedBackend(t *testing.T) {
	b := memlock.New()
	b.Close()
	_, err := dlock.New(b).Acquire(context.Background(), "k")
	if !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Acquire on a closed backend: got %v, want ErrClosed", err)
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	c := dlock.New(memlock.New())
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		l, err := c.Acquire(ctx, fmt.Sprint("k", i%64))
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireReleaseFIFO takes the queue path (Waiter.Wait) for a
// free lock, as a backend whose only waiting mode is a queue does.
func BenchmarkAcquireReleaseFIFO(b *testing.B) {
	c := dlock.New(memlock.New(), dlock.WithFIFO())
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		l, err := c.Acquire(ctx, fmt.Sprint("k", i%64))
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireReleaseParallel is many goroutines of one Client on
// distinct keys: what contends is the Client's own bookkeeping.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	c := dlock.New(memlock.New())
	ctx := context.Background()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprint("k", n.Add(1))
		for pb.Next() {
			l, err := c.Acquire(ctx, key)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
