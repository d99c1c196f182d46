package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// Take a lock, do the work with the fence, release it.
func Example() {
	c := dlock.New(memlock.New(), dlock.WithTTL(10*time.Second))
	defer c.Close()
	ctx := context.Background()

	lease, err := c.Acquire(ctx, "order:1001")
	if err != nil {
		fmt.Println("not acquired:", err)
		return
	}
	defer lease.Release(context.WithoutCancel(ctx))

	work, cancel := lease.Context(ctx) // cancelled with cause dlock.ErrLost if the lease is lost
	defer cancel()
	_ = work
	fmt.Println("holding", lease.Key(), "fence", lease.Fence())
	// Output: holding order:1001 fence 1
}

// Do acquires, runs the function under the lease and always releases.
func ExampleClient_Do() {
	c := dlock.New(memlock.New())
	defer c.Close()
	stock := 3
	for i := 0; i < 5; i++ {
		err := c.Do(context.Background(), "stock:sku-42", func(ctx context.Context, l *dlock.Lease) error {
			if stock == 0 {
				return errors.New("sold out")
			}
			stock--
			return nil
		})
		fmt.Println("buy", i, "->", err)
	}
	fmt.Println("stock left:", stock)
	// Output:
	// buy 0 -> <nil>
	// buy 1 -> <nil>
	// buy 2 -> <nil>
	// buy 3 -> sold out
	// buy 4 -> sold out
	// stock left: 0
}

// TryAcquire never waits: a held lock is reported with ErrNotAcquired.
func ExampleClient_TryAcquire() {
	c := dlock.New(memlock.New())
	defer c.Close()
	ctx := context.Background()
	held, _ := c.Acquire(ctx, "cron:nightly-report")
	defer held.Release(ctx)

	_, err := c.TryAcquire(ctx, "cron:nightly-report")
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired))
	fmt.Println(err)
	// Output:
	// true
	// dlock: lock "cron:nightly-report" not acquired after 1 attempt: held by another owner, wait strategy gave up
}

// A wait ended by the caller's context matches both ErrNotAcquired and the
// context's error, so "gave up" and "ran out of time" can be told apart.
func ExampleAcquireError() {
	c := dlock.New(memlock.New())
	defer c.Close()
	held, _ := c.Acquire(context.Background(), "k")
	defer held.Release(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := c.Acquire(ctx, "k")
	fmt.Println(errors.Is(err, dlock.ErrNotAcquired), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

// WithOwner makes a lock reentrant for an explicit owner: nested
// acquisitions share the fence, and only the last release frees the lock.
func ExampleWithOwner() {
	c := dlock.New(memlock.New(), dlock.WithOwner("request-7f3a"))
	defer c.Close()
	ctx := context.Background()
	outer, _ := c.Acquire(ctx, "account:42")
	inner, _ := c.Acquire(ctx, "account:42") // no waiting: same owner
	fmt.Println(outer.Fence() == inner.Fence(), inner.Count())
	inner.Release(ctx)
	outer.Release(ctx)
	// Output: true 2
}

// Leases are lost, not silently: Done closes and Err says why.
func ExampleLease_Done() {
	c := dlock.New(memlock.New(), dlock.WithTTL(30*time.Millisecond), dlock.WithAutoRenew(false))
	defer c.Close()
	l, _ := c.Acquire(context.Background(), "k")
	<-l.Done() // no renewal: the lease ends at Expires
	fmt.Println(errors.Is(l.Err(), dlock.ErrLost))
	// Output: true
}

// Fences protect the resource: it rejects a write whose fence is older
// than one it has already seen.
func ExampleLease_Fence() {
	store := memlock.NewStore()
	a := dlock.New(store.Backend(), dlock.WithTTL(20*time.Millisecond), dlock.WithAutoRenew(false))
	b := dlock.New(store.Backend())
	defer a.Close()
	defer b.Close()
	ctx := context.Background()

	var highest uint64
	write := func(fence uint64) string {
		if fence < highest {
			return "rejected"
		}
		highest = fence
		return "accepted"
	}
	stale, _ := a.Acquire(ctx, "file")
	<-stale.Done() // a long pause: the lease expires
	fresh, _ := b.Acquire(ctx, "file")
	fmt.Println("fresh write:", write(fresh.Fence()))
	fmt.Println("stale write:", write(stale.Fence()))
	fresh.Release(ctx)
	// Output:
	// fresh write: accepted
	// stale write: rejected
}

// A semaphore lets at most two instances call a rate-limited provider at once.
func ExampleSemaphore() {
	c := dlock.New(memlock.New())
	defer c.Close()
	ctx := context.Background()
	sem := c.Semaphore("payments", 2)

	a, _ := sem.Acquire(ctx)
	b, _ := sem.Acquire(ctx)
	_, err := sem.TryAcquire(ctx)
	fmt.Println("third permit:", errors.Is(err, dlock.ErrNotAcquired))
	a.Release(ctx)
	b.Release(ctx)
	// Output: third permit: true
}

// Readers share a read-write lock; a writer waits for them and gets a
// fence above every reader's.
func ExampleRWLock() {
	c := dlock.New(memlock.New())
	defer c.Close()
	ctx := context.Background()
	rw := c.RWLock("config")

	r1, _ := rw.RLock(ctx)
	r2, _ := rw.RLock(ctx)
	_, err := rw.TryLock(ctx)
	fmt.Println("writer while reading:", errors.Is(err, dlock.ErrNotAcquired))
	r1.Release(ctx)
	r2.Release(ctx)
	w, _ := rw.Lock(ctx)
	fmt.Println("writer's fence above the readers':", w.Fence() > r2.Fence())
	w.Release(ctx)
	// Output:
	// writer while reading: true
	// writer's fence above the readers': true
}

// Two instances campaign; the loser sees who leads and takes over when
// the leader resigns, with a higher term.
func ExampleElection() {
	store := memlock.NewStore()
	a := dlock.New(store.Backend())
	b := dlock.New(store.Backend())
	defer a.Close()
	defer b.Close()
	ctx := context.Background()

	ea, eb := a.Election("scheduler"), b.Election("scheduler")
	first, _ := ea.Campaign(ctx, "host-a")
	leader, _ := eb.Leader(ctx)
	fmt.Println("leader:", leader.Value)

	next := make(chan *dlock.Lease)
	go func() { l, _ := eb.Campaign(ctx, "host-b"); next <- l }()
	ea.Resign(ctx)
	second := <-next
	leader, _ = ea.Leader(ctx)
	fmt.Println("leader:", leader.Value, "higher term:", second.Fence() > first.Fence())
	eb.Resign(ctx)
	// Output:
	// leader: host-a
	// leader: host-b higher term: true
}
