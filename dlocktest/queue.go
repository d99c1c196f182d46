package dlocktest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// queued returns a function reporting how many waiters the server queues
// on key, or skips the test when the backend cannot tell.
func (s *suite) queued(t *testing.T, key string) func() int {
	t.Helper()
	b := s.h.NewBackend(t)
	t.Cleanup(func() { b.Close() })
	_, waits := b.(dlock.Waiter)
	in, ok := b.(dlock.Inspector)
	if !waits || !ok {
		t.Skip("backend has no server-side queue it can inspect")
	}
	probe := func() int {
		info, err := in.Inspect(locktest.Ctx(t, s.long()), key)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		return info.Waiters
	}
	if probe() < 0 {
		t.Skip("backend does not count its waiters")
	}
	return probe
}

// fifoOrder queues waiters one by one behind a holder, cancels two in the
// middle of the queue, and checks that the others are served exactly in
// arrival order and that the cancelled ones left nothing behind.
func (s *suite) fifoOrder(t *testing.T) {
	key := Key(t)
	waiting := s.queued(t, key)
	const waiters = 6
	cancelled := map[int]bool{1: true, 3: true}
	ctx := locktest.Ctx(t, 3*s.long())
	holder := locktest.MustAcquire(t, ctx, s.client(t), key)
	order := make(chan int, waiters)
	errs := make(chan error, waiters)
	cancels := make([]context.CancelFunc, waiters)
	for i := range waiters {
		c := s.client(t)
		wctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		t.Cleanup(cancel)
		go func() {
			l, err := c.Acquire(wctx, key, dlock.WithFIFO())
			if err != nil {
				if cancelled[i] && errors.Is(err, context.Canceled) {
					err = nil
				}
				errs <- err
				return
			}
			order <- i
			errs <- l.Release(context.Background())
		}()
		locktest.WaitFor(t, s.long(),

			fmt.Sprintf("waiter %d queued", i), func() bool {
				select {
				case err := <-errs:
					t.Fatalf("a waiter ended while waiter %d was queueing: %v", i, err)
				default:
				}
				return waiting() == i+1
			})

	}
	left := waiters
	for i := range waiters {
		if cancelled[i] {
			cancels[i]()
			left--
			locktest.WaitFor(t, s.long(), fmt.Sprintf("cancelled waiter %d gone", i), func() bool { return waiting() == left })
		}
	}
	release(t, holder)
	var got, want []int
	for i := range waiters {
		if !cancelled[i] {
			want = append(want, i)
		}
	}
	for done := 0; done < waiters; {
		select {
		case i := <-order:
			got = append(got, i)
		case err := <-errs:
			if err != nil {
				t.Fatalf("waiter: %v", err)
			}
			done++
		case <-ctx.Done():
			t.Fatalf("grants: got %v before the deadline, want %v", got, want)
		}
	}
	for len(order) > 0 { // each waiter reports its turn before its release
		got = append(got, <-order)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("grant order: got %v, want %v", got, want)
	}
	if n := waiting(); n != 0 {
		t.Fatalf("waiters left after every grant: got %d, want 0", n)
	}
}

// cancelQueued checks that a cancelled queued waiter's entry is gone by
// the time Acquire returns.
func (s *suite) cancelQueued(t *testing.T) {
	key := Key(t)
	waiting := s.queued(t, key)
	holder := locktest.MustAcquire(t, locktest.Ctx(t, s.long()), s.client(t), key)
	defer release(t, holder)
	c := s.client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := locktest.Go(func() (*dlock.Lease, error) { return c.Acquire(ctx, key, dlock.WithFIFO()) })
	locktest.WaitFor(t, s.long(), "waiter queued", func() bool { return waiting() == 1 })
	cancel()
	s.endsCancelled(t, got, "cancelled queued Acquire")
	if n := waiting(); n != 0 {
		t.Fatalf("waiters right after the cancelled Acquire returned: got %d, want 0", n)
	}
}
