package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/zklock"
)

// TestFIFOSkipsCancelledWaiters queues a holder and six waiters in a known
// order, cancels two of them in the middle of the queue (the second and
// the fourth: each is the predecessor of one waiter and the node before
// the predecessor of another), releases the holder, and checks that the
// others are granted exactly in queue order and that the cancelled ones
// left nothing behind.
func TestFIFOSkipsCancelledWaiters(t *testing.T) {
	const waiters = 6
	cancelled := map[int]bool{1: true, 3: true}
	k := key(t)
	hc, hb := client(t, zkServer.Addr(), 10*time.Second)
	obs := observer(t, zkServer.Addr())
	ctx := ctxFor(t, time.Minute)
	holder, err := hc.Acquire(ctx, k)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	order := make(chan int, waiters)
	errs := make(chan error, waiters)
	cancels := make([]context.CancelFunc, waiters)
	for i := range waiters {
		c, _ := client(t, zkServer.Addr(), 10*time.Second)
		wctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		t.Cleanup(cancel)
		go func() {
			l, err := c.Acquire(wctx, k)
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
		awaitQueue(t, obs, hb.KeyPath(k), i+2)
	}
	queued := waiters + 1
	for i := range waiters {
		if cancelled[i] {
			cancels[i]()
			queued--
			awaitQueue(t, obs, hb.KeyPath(k), queued)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
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
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("grant order: got waiters %v, want %v", got, want)
	}
	if children, _, err := obs.Children(hb.KeyPath(k)); err != nil || len(children) != 0 {
		t.Fatalf("queue at the end: got %v (err %v), want empty", children, err)
	}
}

// TestWaiterGrantedWithoutListing checks the hand-off shortcut of a
// waiter queued behind the holder and one or two other waiters. Queued,
// it lists the queue once and, in one round trip, watches its predecessor,
// the node before that and its own node. Third in line, the holder's
// release leaves only its predecessor ahead — known without listing,
// since nodes ahead only ever leave. Fourth in line, the release of the
// node before its predecessor makes it list the queue once, while the
// predecessor holds the lock. Either way, the predecessor's release then
// grants it with no request at all.
func TestWaiterGrantedWithoutListing(t *testing.T) {
	const (
		opExists   = 3
		opGetData  = 4
		opChildren = 12
		opPing     = 11
	)
	for _, ahead := range []int{1, 2} {
		t.Run(fmt.Sprintf("waiters-ahead=%d", ahead), func(t *testing.T) {
			k := key(t)
			obs := observer(t, zkServer.Addr())
			hc, hb := client(t, zkServer.Addr(), 10*time.Second)
			ctx := ctxFor(t, time.Minute)
			holder, err := hc.Acquire(ctx, k)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			leases := make([]chan *dlock.Lease, ahead)
			for i := range leases {
				c, _ := client(t, zkServer.Addr(), 10*time.Second)
				leases[i] = make(chan *dlock.Lease, 1)
				go func() {
					l, err := c.Acquire(ctx, k)
					if err != nil {
						t.Errorf("waiter %d: %v", i, err)
					}
					leases[i] <- l
				}()
				awaitQueue(t, obs, hb.KeyPath(k), i+2)
			}

			counter := &opCounter{ops: make(map[int32]int)}
			_, b2 := connect(t, zkServer.Addr(), 10*time.Second, zklock.WithDialer(counter.dial))
			c2 := dlock.New(b2, dlock.WithTTL(10*time.Second))
			t.Cleanup(func() { c2.Close() })
			type result struct {
				l   *dlock.Lease
				ops map[int32]int // requests sent since the last take
				err error
			}
			last := make(chan result, 1)
			go func() {
				l, err := c2.Acquire(ctx, k)
				last <- result{l, counter.take(), err}
			}()
			awaitQueue(t, obs, hb.KeyPath(k), ahead+2)
			// Queued: it listed the queue and watches its predecessor, the
			// node before it and its own node.
			waitOps(t, counter, func(ops map[int32]int) bool {
				return ops[opChildren] == 1 && ops[opGetData] == 2 && ops[opExists] == 1
			})
			counter.take()

			release := func(l *dlock.Lease) {
				t.Helper()
				if err := l.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
			next := func(i int) *dlock.Lease {
				t.Helper()
				l := <-leases[i]
				if l == nil {
					t.FailNow()
				}
				return l
			}
			release(holder)
			l := next(0)
			if ahead == 2 {
				// The node before its predecessor is gone: it lists the
				// queue once and finds its predecessor at the head.
				release(l)
				l = next(1)
				waitOps(t, counter, func(ops map[int32]int) bool { return ops[opChildren] == 1 })
				counter.take()
			}
			release(l)
			r := <-last
			if r.err != nil {
				t.Fatalf("last waiter: %v", r.err)
			}
			defer r.l.Release(context.Background())
			delete(r.ops, opPing)
			if len(r.ops) != 0 {
				t.Fatalf("requests of the last waiter since it was second in line: got %v (by opcode), want none", r.ops)
			}
		})
	}
}

// waitOps waits until the requests counted so far (without taking them)
// satisfy cond.
func waitOps(t *testing.T, c *opCounter, cond func(map[int32]int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		ok := cond(c.ops)
		ops := fmt.Sprint(c.ops)
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests by opcode: got %s, still not the expected ones after 10s", ops)
		}
		time.Sleep(time.Millisecond)
	}
}
