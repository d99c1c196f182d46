package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/zklock"
	"github.com/go-zookeeper/zk"
)

func mustRelease(t *testing.T, l *dlock.Lease) {
	t.Helper()
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestKindHandoff measures the requests of a waiter granted when the
// holder ahead of it releases: a permit of a semaphore of one permit, and
// a read hold behind a writer. Each lists the queue, watches the one node
// that concerns it and deletes its node on release; the permit lists
// again when the holder goes, the reader instead watches its own node
// (pipelined with the other watch), so that the writer's deletion is its
// grant: five requests each.
func TestKindHandoff(t *testing.T) {
	for _, kind := range []dlock.Kind{dlock.KindPermit, dlock.KindRead} {
		t.Run(kind.String(), func(t *testing.T) {
			k := locktest.Key(t)
			ctx := locktest.Ctx(t, time.Minute)
			hc, hb := client(t, zkServer.Addr(), 10*time.Second)
			counter, c, _ := countedClient(t)
			var holder *dlock.Lease
			var err error
			var wait <-chan locktest.Outcome
			if kind == dlock.KindPermit {
				holder, err = hc.Semaphore(k, 1).Acquire(ctx)
				wait = locktest.Go(func() (*dlock.Lease, error) { return c.Semaphore(k, 1).Acquire(ctx) })
			} else {
				holder, err = hc.RWLock(k).Lock(ctx)
				wait = locktest.Go(func() (*dlock.Lease, error) { return c.RWLock(k).RLock(ctx) })
			}
			if err != nil {
				t.Fatal(err)
			}
			waitOps(t, counter, func(ops map[int32]int) bool { return ops[opGetData] == 1 })
			mustRelease(t, holder)
			l := locktest.Granted(t, wait, 30*time.Second)
			start := time.Now()
			mustRelease(t, l)
			awaitQueue(t, observer(t, zkServer.Addr()), hb.KeyPath(k), 0)
			ops := counter.Take()
			delete(ops, opPing)
			want := map[int32]int{opCreate: 1, opChildren: 2, opGetData: 1, opDelete: 1}
			if kind == dlock.KindRead {
				want = map[int32]int{opCreate: 1, opChildren: 1, opGetData: 1, opExists: 1, opDelete: 1}
			}
			if time.Since(start) >= zklock.WatchDelay/2 {
				ops[opExists] = want[opExists] // a hold long enough for its loss watch
			}
			if !maps.Equal(ops, want) {
				t.Fatalf("requests of a %s waiter from its acquisition to its release: got %v (by opcode), want %v", kind, ops, want)
			}
		})
	}
}

// TestPermitWakesFirstWaiterOnly queues three waiters behind the two
// holders of a semaphore of two permits and releases a holder: only the
// first waiter is granted; the second, which watched it, lists once and
// watches the two holders; the third sends nothing.
func TestPermitWakesFirstWaiterOnly(t *testing.T) {
	const n = 2
	k := locktest.Key(t)
	obs := observer(t, zkServer.Addr())
	ctx := locktest.Ctx(t, time.Minute)
	hc, hb := client(t, zkServer.Addr(), 10*time.Second)
	holders := locktest.MustPermits(t, ctx, hc.Semaphore(k, n), n)
	path := hb.KeyPath(k)
	var waits []<-chan locktest.Outcome
	var counters []*opCounter
	for i := range 3 {
		counter, c, _ := countedClient(t)
		waits = append(waits, locktest.Go(func() (*dlock.Lease, error) { return c.Semaphore(k, n).Acquire(ctx) }))
		counters = append(counters, counter)
		awaitQueue(t, obs, path, n+i+1)
	}
	// Placed: the first waiter watches both holders, the others their
	// predecessors.
	waitOps(t, counters[0], func(ops map[int32]int) bool { return ops[opGetData] == n })
	waitOps(t, counters[1], func(ops map[int32]int) bool { return ops[opGetData] == 1 })
	waitOps(t, counters[2], func(ops map[int32]int) bool { return ops[opGetData] == 1 })
	for _, c := range counters {
		c.Take()
	}
	mustRelease(t, holders[1])
	first := locktest.Granted(t, waits[0], 30*time.Second)
	// The grant's signal wakes the second waiter, now first in line.
	waitOps(t, counters[0], func(ops map[int32]int) bool { return ops[opSetData] == 1 })
	waitOps(t, counters[1], func(ops map[int32]int) bool { return ops[opChildren] == 1 && ops[opGetData] == n })
	locktest.NotYet(t, waits[1], "second waiter")
	locktest.NotYet(t, waits[2], "third waiter")
	if ops := counters[2].Take(); ops[opChildren]+ops[opGetData]+ops[opExists] != 0 {
		t.Fatalf("third waiter's requests after a release: got %v (by opcode), want none", ops)
	}
	// The next release goes to the second waiter, with no listing by the
	// third.
	counters[1].Take()
	mustRelease(t, holders[0])
	second := locktest.Granted(t, waits[1], 30*time.Second)
	if first.Fence() <= holders[1].Fence() || second.Fence() <= first.Fence() {
		t.Fatalf("fences %d, %d, then %d and %d: want increasing in arrival order", holders[0].Fence(), holders[1].Fence(), first.Fence(), second.Fence())
	}
	mustRelease(t, first)
	mustRelease(t, locktest.Granted(t, waits[2], 30*time.Second))
	mustRelease(t, second)
	awaitQueue(t, obs, path, 0)
}

// TestReaderWatchesNearestWriter queues reader, writer, reader, writer,
// reader: each reader behind a writer waits (a queued writer stops later
// readers), and is woken only when the writer nearest ahead of it leaves.
func TestReaderWatchesNearestWriter(t *testing.T) {
	k := locktest.Key(t)
	obs := observer(t, zkServer.Addr())
	ctx := locktest.Ctx(t, time.Minute)
	c0, b0 := client(t, zkServer.Addr(), 10*time.Second)
	r0, err := c0.RWLock(k).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	path := b0.KeyPath(k)
	kinds := []dlock.Kind{dlock.KindLock, dlock.KindRead, dlock.KindLock, dlock.KindRead}
	var waits []<-chan locktest.Outcome
	var counters []*opCounter
	for i, kind := range kinds {
		counter, c, _ := countedClient(t)
		rw := c.RWLock(k)
		f := rw.Lock
		if kind == dlock.KindRead {
			f = rw.RLock
		}
		waits = append(waits, locktest.Go(func() (*dlock.Lease, error) { return f(ctx) }))
		counters = append(counters, counter)
		awaitQueue(t, obs, path, i+2)
	}
	// Give every waiter time to place itself: the last reader watches the
	// second writer.
	waitOps(t, counters[3], func(ops map[int32]int) bool { return ops[opGetData] == 1 })
	waitOps(t, counters[1], func(ops map[int32]int) bool { return ops[opGetData] == 1 })
	for _, c := range counters {
		c.Take()
	}
	mustRelease(t, r0)
	w1 := locktest.Granted(t, waits[0], 30*time.Second)
	if w1.Fence() <= r0.Fence() {
		t.Fatalf("writer's fence %d, want above the reader's %d", w1.Fence(), r0.Fence())
	}
	locktest.NotYet(t, waits[1], "reader behind the writer")
	mustRelease(t, w1)
	r2 := locktest.Granted(t, waits[1], 30*time.Second)
	if r2.Fence() <= w1.Fence() {
		t.Fatalf("reader's fence %d after the writer's %d: want above", r2.Fence(), w1.Fence())
	}
	locktest.NotYet(t, waits[2], "second writer")
	locktest.NotYet(t, waits[3], "reader behind the second writer")
	if ops := counters[3].Take(); ops[opChildren]+ops[opGetData]+ops[opExists] != 0 {
		t.Fatalf("last reader's requests after releases that did not concern it: got %v (by opcode), want none", ops)
	}
	// Inspect sees the reader as the holder and the two behind as waiting.
	info, err := b0.Inspect(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Kind != dlock.KindRead || len(info.Holds) != 1 || info.Holds[0].Fence != r2.Fence() || info.Holds[0].Owner != r2.Owner() || info.Waiters != 2 {
		t.Fatalf("Inspect: got %+v, want one read hold (fence %d) and 2 waiters", info, r2.Fence())
	}
	mustRelease(t, r2)
	w3 := locktest.Granted(t, waits[2], 30*time.Second)
	mustRelease(t, w3)
	r4 := locktest.Granted(t, waits[3], 30*time.Second)
	mustRelease(t, r4)
	awaitQueue(t, obs, path, 0)
}

// TestKindMismatch: a permit behind a lock, a lock or a read hold behind
// permits, and a permit count that disagrees with the holders' fail with
// clear errors and leave no node behind; the holders keep their holds.
func TestKindMismatch(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	obs := observer(t, zkServer.Addr())
	hc, hb := client(t, zkServer.Addr(), 10*time.Second)
	c, _ := client(t, zkServer.Addr(), 10*time.Second)

	lk := locktest.Key(t)
	lock := locktest.MustAcquire(t, ctx, hc, lk)
	if _, err := c.Semaphore(lk, 2).Acquire(ctx); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("permit of a locked key: got %v, want ErrWrongType", err)
	}
	awaitQueue(t, obs, hb.KeyPath(lk), 1)
	mustRelease(t, lock)

	sk := locktest.Key(t)
	permit, err := hc.Semaphore(sk, 2).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, sk); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("lock of a semaphore's key: got %v, want ErrWrongType", err)
	}
	if _, err := c.RWLock(sk).RLock(ctx); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("read hold of a semaphore's key: got %v, want ErrWrongType", err)
	}
	if _, err := c.Semaphore(sk, 3).Acquire(ctx); !errors.Is(err, dlock.ErrPermits) {
		t.Fatalf("3 permits where the holder says 2: got %v, want ErrPermits", err)
	}
	awaitQueue(t, obs, hb.KeyPath(sk), 1)
	if permit.Err() != nil {
		t.Fatalf("holder after the refused requests: %v", permit.Err())
	}
	info, err := hb.Inspect(ctx, sk)
	if err != nil {
		t.Fatal(err)
	}
	if info.Kind != dlock.KindPermit || info.Permits != 2 || len(info.Holds) != 1 || info.Holds[0].Fence != permit.Fence() {
		t.Fatalf("Inspect: got %+v, want one of 2 permits, fence %d", info, permit.Fence())
	}
	mustRelease(t, permit)
	awaitQueue(t, obs, hb.KeyPath(sk), 0)
}

// TestPermitOfDeadHolder: a holder whose session ends without releasing
// (its Backend closed) gives its permit back at once: its node was
// ephemeral.
func TestPermitOfDeadHolder(t *testing.T) {
	k := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	_, hb := connect(t, zkServer.Addr(), 10*time.Second)
	hc := dlock.New(hb, dlock.WithTTL(10*time.Second))
	dead, err := hc.Semaphore(k, 1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := client(t, zkServer.Addr(), 10*time.Second)
	wait := locktest.Go(func() (*dlock.Lease, error) { return c.Semaphore(k, 1).Acquire(ctx) })
	awaitQueue(t, observer(t, zkServer.Addr()), hb.KeyPath(k), 2)
	start := time.Now()
	hb.Close() // the session ends; the Client is not told to release
	l := locktest.Granted(t, wait, 30*time.Second)
	t.Logf("permit returned %v after the holder's session ended", time.Since(start))
	if l.Fence() <= dead.Fence() {
		t.Fatalf("fence %d after the dead holder's %d: want above", l.Fence(), dead.Fence())
	}
	select {
	case <-dead.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("dead holder's lease not ended")
	}
	mustRelease(t, l)
	hc.Close()
}

// TestElectionValue: a leader's value is kept with its node whatever
// bytes it holds, Inspect reports it, and the next leader's term is
// higher.
func TestElectionValue(t *testing.T) {
	k := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	c1, b1 := client(t, zkServer.Addr(), 10*time.Second)
	c2, _ := client(t, zkServer.Addr(), 10*time.Second)
	e1, e2 := c1.Election(k), c2.Election(k)
	val := "\x00leader\nvalue\x00"
	l1, err := e1.Campaign(ctx, val)
	if err != nil {
		t.Fatal(err)
	}
	wait := locktest.Go(func() (*dlock.Lease, error) { return e2.Campaign(ctx, "second") })
	awaitQueue(t, observer(t, zkServer.Addr()), b1.KeyPath(k), 2)
	cur, err := e2.Leader(ctx)
	if err != nil || cur.Value != val || cur.Term != l1.Fence() || cur.Owner != l1.Owner() {
		t.Fatalf("Leader: got %+v, %v; want value %q, term %d, owner %s", cur, err, val, l1.Fence(), l1.Owner())
	}
	if err := e1.Proclaim(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if cur, err := e2.Leader(ctx); err != nil || cur.Value != "" || cur.Owner != l1.Owner() {
		t.Fatalf("Leader after Proclaim(\"\"): got %+v, %v", cur, err)
	}
	locktest.NotYet(t, wait, "second campaigner")
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := locktest.Granted(t, wait, 30*time.Second)
	if cur, err := e1.Leader(ctx); err != nil || cur.Value != "second" || cur.Term != l2.Fence() || cur.Term <= l1.Fence() {
		t.Fatalf("Leader after the hand-over: got %+v, %v; want value second, term %d > %d", cur, err, l2.Fence(), l1.Fence())
	}
	mustRelease(t, l2)
}

// TestForeignNodesAreLocks: a node of go-zookeeper's zk.Lock in the
// queue is an exclusive holder for readers and permits alike.
func TestForeignNodesAreLocks(t *testing.T) {
	k := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	c, b := client(t, zkServer.Addr(), 10*time.Second)
	zl := zk.NewLock(observer(t, zkServer.Addr()), b.KeyPath(k), zk.WorldACL(zk.PermAll))
	if err := zl.Lock(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RWLock(k).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("read hold while zk.Lock holds: got %v, want ErrNotAcquired", err)
	}
	if _, err := c.Semaphore(k, 2).TryAcquire(ctx); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("permit while zk.Lock holds: got %v, want ErrWrongType", err)
	}
	info, err := b.Inspect(ctx, k)
	if err != nil || !info.Held || info.Kind != dlock.KindLock {
		t.Fatalf("Inspect: got %+v, %v; want a lock held", info, err)
	}
	if err := zl.Unlock(); err != nil {
		t.Fatal(err)
	}
	l, err := c.RWLock(k).TryRLock(ctx)
	if err != nil {
		t.Fatalf("read hold after zk.Lock's release: %v", err)
	}
	mustRelease(t, l)
}

// TestKindFenceAndLoss, with a Backend from Connect and from New, for a
// permit and a read hold: the fence is the node's czxid, granted at once
// or after waiting; the deletion of the node behind the holder's back
// ends the lease at once, watched yet or not; nothing is left behind.
func TestKindFenceAndLoss(t *testing.T) {
	for _, mode := range modes {
		for _, kind := range []dlock.Kind{dlock.KindPermit, dlock.KindRead} {
			for _, watched := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/watched=%v", mode, kind, watched), func(t *testing.T) {
					kindFenceAndLoss(t, mode, kind, watched)
				})
			}
		}
	}
}

func kindFenceAndLoss(t *testing.T, mode string, kind dlock.Kind, watched bool) {
	c, b := modeClient(t, mode)
	hc, _ := client(t, zkServer.Addr(), 10*time.Second)
	obs := observer(t, zkServer.Addr())
	ctx := locktest.Ctx(t, time.Minute)
	k := locktest.Key(t)
	path := b.KeyPath(k)
	acquire := func(c *dlock.Client, holder bool) (*dlock.Lease, error) {
		switch {
		case kind == dlock.KindPermit:
			return c.Semaphore(k, 1).Acquire(ctx)
		case holder:
			return c.RWLock(k).Lock(ctx) // a writer the reader waits for
		}
		return c.RWLock(k).RLock(ctx)
	}
	l, err := acquire(c, false)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Fence(), fenceOf(t, obs, path); got != want {
		t.Fatalf("fence: got %d, want the node's czxid %d", got, want)
	}
	mustRelease(t, l)
	awaitQueue(t, obs, path, 0)

	h, err := acquire(hc, true)
	if err != nil {
		t.Fatal(err)
	}
	wait := locktest.Go(func() (*dlock.Lease, error) { return acquire(c, false) })
	awaitQueue(t, obs, path, 2)
	mustRelease(t, h)
	l = locktest.Granted(t, wait, 30*time.Second)
	if got, want := l.Fence(), fenceOf(t, obs, path); got != want || got <= h.Fence() {
		t.Fatalf("fence after waiting: got %d, want the node's czxid %d, above the holder's %d", got, want, h.Fence())
	}
	if watched {
		locktest.WaitFor(t, 10*time.Second, "hold watched", func() bool { return b.Watched(k) })
	}
	node := awaitQueue(t, obs, path, 1)[0] // the holder's left
	if err := obs.Delete(path+"/"+node, -1); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("lease not ended 10s after its node was deleted")
	}
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Fatalf("lease Err: got %v, want ErrLost", l.Err())
	}
	l.Release(context.Background())
	awaitQueue(t, obs, path, 0)
}
