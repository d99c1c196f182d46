package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
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

func TestClosedBackend(t *testing.T) {
	b := memlock.New()
	b.Close()
	_, err := dlock.New(b).Acquire(context.Background(), "k")
	if !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Acquire on a closed backend: got %v, want ErrClosed", err)
	}
}

// BenchmarkAcquireRelease is an uncontended Acquire and Release.
func BenchmarkAcquireRelease(b *testing.B) { benchAcquireRelease(b, dlock.New(memlock.New())) }

// BenchmarkAcquireReleaseFIFO takes the queue path (Waiter.Wait) for a
// free lock, as a backend whose only waiting mode is a queue does.
func BenchmarkAcquireReleaseFIFO(b *testing.B) {
	benchAcquireRelease(b, dlock.New(memlock.New(), dlock.WithFIFO()))
}

// benchAcquireRelease takes and releases a lock on one of 64 keys with c,
// once per iteration.
func benchAcquireRelease(b *testing.B, c *dlock.Client) {
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

// TestZeroStore: a zero Store is an empty one.
func TestZeroStore(t *testing.T) {
	var s memlock.Store
	c := dlock.New(s.Backend())
	defer c.Close()
	ctx := context.Background()
	l, err := c.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	other := dlock.New(s.Backend())
	defer other.Close()
	if _, err := other.TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire through another Backend of the store: got %v, want ErrNotAcquired", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClaimingWriterBeforeQueuedReader: a writer that waits by retrying
// (it claims the key from new readers) and a FIFO reader queued behind
// its claim do not wait for each other when the last reader leaves: the
// writer goes first (its claim kept the reader out), then the reader.
// They used to wait until the claim expired, a TTL (30s here) later.
func TestClaimingWriterBeforeQueuedReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		store := memlock.NewStore()
		c := dlock.New(store.Backend(), dlock.WithTTL(30*time.Second))
		defer c.Close()
		r1, err := c.RWLock("k").RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			l   *dlock.Lease
			err error
		}
		wrote, read := make(chan result, 1), make(chan result, 1)
		go func() {
			l, err := c.RWLock("k").Lock(ctx)
			wrote <- result{l, err}
		}()
		synctest.Wait() // the writer claimed the key and waits
		go func() {
			l, err := c.RWLock("k").RLock(ctx, dlock.WithFIFO())
			read <- result{l, err}
		}()
		synctest.Wait() // the reader is queued behind the claim
		if n := store.QueueLen("k"); n != 1 {
			t.Fatalf("queue: %d waiters, want the reader", n)
		}
		released := time.Now()
		if err := r1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var w result
		select {
		case w = <-wrote:
		case <-time.After(10 * time.Second):
			t.Fatal("writer not served 10s after the last reader left (its claim lasts 30s)")
		}
		if w.err != nil {
			t.Fatal(w.err)
		}
		if d := time.Since(released); d >= time.Second {
			t.Fatalf("writer served %v after the last reader left, want at once", d)
		}
		select {
		case <-read:
			t.Fatal("the queued reader entered while the writer holds the key")
		default:
		}
		if err := w.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r2 := <-read
		if r2.err != nil {
			t.Fatal(r2.err)
		}
		if d := time.Since(released); d >= time.Second {
			t.Fatalf("reader served %v after the writer left, want at once", d)
		}
		r2.l.Release(ctx)
	})
}
