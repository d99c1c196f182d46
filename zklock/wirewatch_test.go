package zklock_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/zklock"
	"github.com/go-zookeeper/zk"
)

// The leases of these tests are not renewed (WithAutoRenew(false)) and
// live 10 s: a loss reported within a few seconds can only come from the
// watch on the node (or, after a reconnection, from the reads that watch
// the nodes again), not from a renewal or the lease's expiry.

// heldLeases acquires n leases of keys prefix.0 … prefix.(n-1) through c,
// and waits until b watches every held node.
func heldLeases(t *testing.T, c *dlock.Client, b *zklock.Backend, prefix string, n int) []*dlock.Lease {
	t.Helper()
	ctx := locktest.Ctx(t, time.Minute)
	ls := make([]*dlock.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				ls[i], errs[i] = c.Acquire(ctx, fmt.Sprintf("%s.%d", prefix, i))
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
	}
	awaitWatched(t, b)
	return ls
}

// awaitWatched waits until b watches every node it holds.
func awaitWatched(t *testing.T, b *zklock.Backend) {
	t.Helper()
	locktest.WaitFor(t, 10*time.Second, "every hold watched", func() bool { return b.Unwatched() == 0 })
}

// deleteNode deletes the lock node of key with a plain connection.
func deleteNode(t *testing.T, obs *zk.Conn, b *zklock.Backend, key string) {
	t.Helper()
	path := b.KeyPath(key)
	children, _, err := obs.Children(path)
	if err != nil || len(children) != 1 {
		t.Fatalf("Children(%s): got %v, %v, want one node", path, children, err)
	}
	if err := obs.Delete(path+"/"+children[0], -1); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}

// awaitLost waits up to d for l to end, and checks that it ended lost,
// with a cause that contains want.
func awaitLost(t *testing.T, l *dlock.Lease, d time.Duration, want string) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(d):
		t.Fatalf("lease %s not ended within %v", l.Key(), d)
	}
	err := l.Err()
	if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, dlock.ErrNotHeld) || !strings.Contains(err.Error(), want) {
		t.Fatalf("lease %s: got Err %v, want ErrLost and ErrNotHeld, with %q", l.Key(), err, want)
	}
}

// checkHeld checks that every lease of ls but those in lost is held.
func checkHeld(t *testing.T, ls []*dlock.Lease, lost ...int) {
	t.Helper()
	for i, l := range ls {
		gone := false
		for _, j := range lost {
			gone = gone || i == j
		}
		if err := l.Err(); !gone && err != nil {
			t.Fatalf("lease %d, whose node is untouched: got Err %v, want nil", i, err)
		}
	}
}

// TestManyHeldOneDeleted holds many locks through one Connect Backend and
// deletes the nodes of a few, one at a time, with a plain connection: the
// lease of each, and only it, is reported lost at once.
func TestManyHeldOneDeleted(t *testing.T) {
	const n = 300
	c, b := client(t, zkServer.Addr(), 10*time.Second, dlock.WithAutoRenew(false))
	obs := observer(t, zkServer.Addr())
	k := locktest.Key(t)
	ls := heldLeases(t, c, b, k, n)
	var lost []int
	for _, i := range []int{0, 157, n - 1} {
		deleteNode(t, obs, b, ls[i].Key())
		awaitLost(t, ls[i], 2*time.Second, "was deleted")
		lost = append(lost, i)
		checkHeld(t, ls, lost...)
	}
	// The others are still proven by their watches.
	ctx := locktest.Ctx(t, time.Minute)
	for _, i := range []int{1, 200} {
		if err := ls[i].Refresh(ctx, 0); err != nil {
			t.Fatalf("Refresh of lease %d: %v", i, err)
		}
	}
	checkHeld(t, ls, lost...)
}

// TestReconnectionWatchesAgain drops the connection of a Backend holding
// locks and keeps it from reconnecting while the node of one lease is
// deleted: once the session resumes on a new connection, that lease is
// reported lost and the other nodes are watched again, so that deleting
// another one is reported at once.
func TestReconnectionWatchesAgain(t *testing.T) {
	const n = 20
	proxy := startStallProxy(t, zkServer.Addr())
	conn, b := connect(t, proxy.Addr(), 10*time.Second)
	c := dlock.New(b, dlock.WithTTL(10*time.Second), dlock.WithAutoRenew(false))
	t.Cleanup(func() { c.Close() })
	obs := observer(t, zkServer.Addr())
	ls := heldLeases(t, c, b, locktest.Key(t), n)
	session := conn.SessionID()

	proxy.shut()
	deleteNode(t, obs, b, ls[3].Key())
	proxy.heal()
	awaitLost(t, ls[3], 5*time.Second, "is gone")
	awaitWatched(t, b)
	if got := conn.SessionID(); got != session {
		t.Fatalf("session after the reconnection: got %#x, want %#x (the same)", got, session)
	}
	if got := proxy.Forwarded(); got < 2 {
		t.Fatalf("connections through the proxy: got %d, want at least 2", got)
	}
	checkHeld(t, ls, 3)

	deleteNode(t, obs, b, ls[11].Key())
	awaitLost(t, ls[11], 2*time.Second, "was deleted")
	checkHeld(t, ls, 3, 11)
}

// TestConnClosedLosesLeases closes the connection under a Connect Backend
// (its user may): the session ends, and every lease is reported lost at
// once — by the deletion of its node when the server is reachable (it
// deletes the session's nodes before answering the close), by the
// connection's end when it is not.
func TestConnClosedLosesLeases(t *testing.T) {
	for _, reachable := range []bool{true, false} {
		t.Run(fmt.Sprintf("reachable=%v", reachable), func(t *testing.T) {
			proxy := startStallProxy(t, zkServer.Addr())
			conn, b := connect(t, proxy.Addr(), 10*time.Second)
			c := dlock.New(b, dlock.WithTTL(10*time.Second), dlock.WithAutoRenew(false))
			t.Cleanup(func() { c.Close() })
			ls := heldLeases(t, c, b, locktest.Key(t), 3)
			want := "was deleted"
			if !reachable {
				proxy.shut()
				want = "connection closed"
			}
			conn.Close()
			for _, l := range ls {
				awaitLost(t, l, 3*time.Second, want)
			}
		})
	}
}
