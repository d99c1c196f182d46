package zklock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

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
	for _, ahead := range []int{1, 2} {
		t.Run(fmt.Sprintf("waiters-ahead=%d", ahead), func(t *testing.T) {
			k := locktest.Key(t)
			obs := observer(t, zkServer.Addr())
			hc, hb := client(t, zkServer.Addr(), 10*time.Second)
			ctx := locktest.Ctx(t, time.Minute)
			holder := locktest.MustAcquire(t, ctx, hc, k)
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

			counter, c2, _ := countedClient(t)
			type result struct {
				l   *dlock.Lease
				ops map[int32]int // requests sent since the last take
				err error
			}
			last := make(chan result, 1)
			go func() {
				l, err := c2.Acquire(ctx, k)
				last <- result{l, counter.Take(), err}
			}()
			awaitQueue(t, obs, hb.KeyPath(k), ahead+2)
			// Queued: it listed the queue and watches its predecessor, the
			// node before it and its own node.
			waitOps(t, counter, func(ops map[int32]int) bool {
				return ops[opChildren] == 1 && ops[opGetData] == 2 && ops[opExists] == 1
			})
			counter.Take()

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
				counter.Take()
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
	locktest.WaitFor(t, 10*time.Second, "the expected requests by opcode", func() bool { return cond(c.Snapshot()) })
}
