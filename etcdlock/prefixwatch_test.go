package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// holdMany acquires n locks through c, 16 at a time, and returns them;
// they are released when the test ends.
func holdMany(t *testing.T, c *dlock.Client, n int) []*dlock.Lease {
	t.Helper()
	ctx := locktest.Ctx(t, 60*time.Second)
	key := locktest.Key(t)
	leases := make([]*dlock.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			leases[i], errs[i] = c.Acquire(ctx, fmt.Sprintf("%s.%03d", key, i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
	}
	t.Cleanup(func() {
		for _, l := range leases {
			l.Release(context.Background())
		}
	})
	return leases
}

// lostWithin waits up to d for l to be reported lost with ErrLost.
func lostWithin(t *testing.T, l *dlock.Lease, d time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(d):
		t.Fatalf("lease %q: Done not closed within %v of its key's deletion", l.Key(), d)
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("lease %q: Err got %v, want ErrLost", l.Key(), err)
	}
}

// noneLost fails if a lease of ls other than those in except was lost.
func noneLost(t *testing.T, ls []*dlock.Lease, except ...*dlock.Lease) {
	t.Helper()
outer:
	for i, l := range ls {
		for _, e := range except {
			if l == e {
				continue outer
			}
		}
		select {
		case <-l.Done():
			t.Fatalf("lease %d (%q): got lost (%v), want held", i, l.Key(), l.Err())
		default:
		}
	}
}

// deleteKey deletes the etcd key of l with a plain etcd client, as an
// operator or another program would.
func deleteKey(t *testing.T, b *etcdlock.Backend, l *dlock.Lease) {
	t.Helper()
	cli := newCli(t, srv.Endpoints())
	resp, err := cli.Delete(locktest.Ctx(t, 5*time.Second), b.LockKey(l.Key(), l.Owner()))
	if err != nil {
		t.Fatalf("delete the key of %q: %v", l.Key(), err)
	}
	if resp.Deleted != 1 {
		t.Fatalf("delete the key of %q: got %d keys deleted, want 1", l.Key(), resp.Deleted)
	}
}

// TestPrefixWatchReportsDeletedKey: with more held locks than the
// threshold, a Backend has no watch per lock (none had started: the
// delay is long here), and a lock whose key is deleted on the server (by
// a plain etcd client) is reported lost, and only that one. Renewal alone
// would never find it: the shared etcd lease stays alive.
func TestPrefixWatchReportsDeletedKey(t *testing.T) {
	c, b := newClient(t, srv.Endpoints())
	etcdlock.SetLossWatchDelay(b, time.Hour)
	n := etcdlock.PrefixWatchMin() + 16
	leases := holdMany(t, c, n)
	awaitPrefixWatch(t, b, "the prefix watch, and no watch per lock", 0)
	victim := leases[n/2]
	deleteKey(t, b, victim)
	lostWithin(t, victim, 5*time.Second)
	noneLost(t, leases, victim)
}

// TestPrefixWatchIgnoresOthersAndOwnReleases: the prefix watch sees every
// deletion under the prefix; deletions of other Backends' locks, and of
// the earlier incarnation of a lock released and taken again (the same
// etcd key), end no hold. The prefix watch starts at the oldest held
// lock's revision (no lock's own watch has started: the delay is long
// here), so it replays those deletions after the new incarnation is held.
func TestPrefixWatchIgnoresOthersAndOwnReleases(t *testing.T) {
	c, b := newClient(t, srv.Endpoints())
	etcdlock.SetLossWatchDelay(b, time.Hour)
	other, _ := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 20*time.Second)
	key := locktest.Key(t)
	oldest := locktest.MustAcquire(t, ctx, c, key+".oldest")
	t.Cleanup(func() { oldest.Release(context.Background()) })
	// Another Backend's lock, taken and released.
	ol := locktest.MustAcquire(t, ctx, other, key+".other")
	if err := ol.Release(ctx); err != nil {
		t.Fatalf("Release (other): %v", err)
	}
	// One of ours released and taken again: same etcd key, new fence.
	first := locktest.MustAcquire(t, ctx, c, key+".again")
	name := b.LockKey(first.Key(), first.Owner())
	if err := first.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	again := locktest.MustAcquire(t, ctx, c, key+".again")
	t.Cleanup(func() { again.Release(context.Background()) })
	if got := b.LockKey(again.Key(), again.Owner()); got != name {
		t.Fatalf("etcd key of the lock taken again: got %s, want %s (the same slot)", got, name)
	}
	if prefix, _, _ := etcdlock.WatchState(b); prefix {
		t.Fatal("prefix watch with 2 locks held, want a watch per lock")
	}
	leases := holdMany(t, c, etcdlock.PrefixWatchMin())
	awaitPrefixWatch(t, b, "the prefix watch", -1)
	// A deletion after all that: once it is reported, the watch has
	// delivered the earlier ones too (events come in revision order).
	victim := leases[1]
	deleteKey(t, b, victim)
	lostWithin(t, victim, 5*time.Second)
	noneLost(t, append(leases, oldest, again), victim)
}

// TestPrefixWatchKeepsRunningOwnWatches: a lock whose own watch runs
// when the prefix watch starts keeps it (the prefix watch starts after
// its grant), and its deletion is still reported, as is that of a lock
// the prefix watch covers.
func TestPrefixWatchKeepsRunningOwnWatches(t *testing.T) {
	c, b := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 20*time.Second)
	old := locktest.MustAcquire(t, ctx, c, locktest.Key(t)+".old")
	t.Cleanup(func() { old.Release(context.Background()) })
	locktest.WaitFor(t, 5*time.Second, "the lock's own watch", func() bool {
		_, _, running := etcdlock.WatchState(b)
		return running == 1
	})
	etcdlock.SetLossWatchDelay(b, time.Hour)
	leases := holdMany(t, c, etcdlock.PrefixWatchMin())
	etcdlock.SetLossWatchDelay(b, 0)
	if prefix, own, running := etcdlock.WatchState(b); !prefix || own != 1 || running != 1 {
		t.Fatalf("got prefix watch %v, %d own watches (%d running); want true, 1 (1)", prefix, own, running)
	}
	deleteKey(t, b, old)
	lostWithin(t, old, 5*time.Second)
	victim := leases[5]
	deleteKey(t, b, victim)
	lostWithin(t, victim, 5*time.Second)
	noneLost(t, leases, victim)
}

// TestPrefixWatchBackToPerLockWatches: when most locks are released, the
// Backend goes back to a watch per lock, and a deletion is still
// reported.
func TestPrefixWatchBackToPerLockWatches(t *testing.T) {
	c, b := newClient(t, srv.Endpoints())
	leases := holdMany(t, c, etcdlock.PrefixWatchMin()+16)
	awaitPrefixWatch(t, b, "the prefix watch", -1)
	keep := 4
	ctx := locktest.Ctx(t, 20*time.Second)
	for _, l := range leases[keep:] {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	if prefix, own, _ := etcdlock.WatchState(b); prefix || own != keep {
		t.Fatalf("after releasing all but %d: got prefix watch %v, %d own watches; want false, %d", keep, prefix, own, keep)
	}
	victim := leases[1]
	deleteKey(t, b, victim)
	lostWithin(t, victim, 5*time.Second)
	noneLost(t, leases[:keep], victim)
}

// TestPrefixWatchRestarted: when the prefix watch ends (compacted, or
// cancelled by the server), the Backend reads its locks again and
// watches anew; a deletion meanwhile or after is reported.
func TestPrefixWatchRestarted(t *testing.T) {
	c, b := newClient(t, srv.Endpoints())
	leases := holdMany(t, c, etcdlock.PrefixWatchMin()+16)
	awaitPrefixWatch(t, b, "the prefix watch", -1)
	if !etcdlock.EndPrefixWatch(b) {
		t.Fatal("EndPrefixWatch: got no prefix watch, want one")
	}
	first := leases[3]
	deleteKey(t, b, first)
	lostWithin(t, first, 5*time.Second)
	awaitPrefixWatch(t, b, "a new prefix watch", -1)
	second := leases[7]
	deleteKey(t, b, second)
	lostWithin(t, second, 5*time.Second)
	noneLost(t, leases, first, second)
}

// TestManyHeldGoroutines: holding many locks costs no goroutine per lock
// (a watch per lock costs one in the etcd client).
func TestManyHeldGoroutines(t *testing.T) {
	c, b := newClient(t, srv.Endpoints())
	etcdlock.SetLossWatchDelay(b, time.Hour) // no lock's own watch starts before the prefix watch
	holdMany(t, c, 1)                        // connections, lease
	runtime.GC()
	before := runtime.NumGoroutine()
	n := 4 * etcdlock.PrefixWatchMin()
	holdMany(t, c, n)
	awaitPrefixWatch(t, b, "the prefix watch, and no watch per lock", 0)
	if got, limit := runtime.NumGoroutine()-before, 16; got > limit {
		t.Fatalf("holding %d more locks: got %d more goroutines, want at most %d", n, got, limit)
	}
}

// awaitPrefixWatch waits until b watches its whole prefix and, unless own
// is negative, own of its held locks have a watch of their own.
func awaitPrefixWatch(t *testing.T, b *etcdlock.Backend, what string, own int) {
	t.Helper()
	locktest.WaitFor(t, 5*time.Second, what, func() bool {
		prefix, n, _ := etcdlock.WatchState(b)
		return prefix && (own < 0 || n == own)
	})
}
