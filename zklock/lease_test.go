package zklock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/zklock"
	"github.com/go-zookeeper/zk"
)

// TestReentryOutlivesLostSibling: a hold re-entered (count 2) whose first
// lease ends without Release (the Client gave it up as expired) before
// the re-entry's lease has registered for loss notification keeps its
// node: the re-entry is a live hold. Once it is released too, the node of
// the grant nobody holds any more is deleted (in the background: the lost
// lease was never released).
func TestReentryOutlivesLostSibling(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	b, obs, r, g := ownedGrant(t)
	r.Fence = g.Fence
	stop1 := b.NotifyLoss(r, func(error) {})
	if g, err := b.TryAcquire(ctx, dlock.Request{Key: r.Key, Token: r.Token, TTL: r.TTL, Reentrant: true}); err != nil || !g.OK || g.Count != 2 {
		t.Fatalf("re-entry: got %+v, %v, want a grant with count 2", g, err)
	}
	stop1() // the first lease ended as lost, without Release
	lost := make(chan error, 1)
	stop2 := b.NotifyLoss(r, func(err error) { lost <- err })
	select {
	case err := <-lost:
		t.Fatalf("re-entry reported lost at registration: %v", err)
	default:
	}
	if err := b.Refresh(ctx, r); err != nil {
		t.Fatalf("Refresh of the re-entry: got %v, want nil", err)
	}
	children := awaitQueue(t, obs, b.KeyPath(r.Key), 1)
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("Release of the re-entry: %v", err)
	}
	stop2()
	awaitGone(t, obs, b.KeyPath(r.Key)+"/"+children[0])
}

// TestLostHoldIsReaped: a hold whose only lease ends without Release (the
// Client gave it up) has its node deleted in the background, while a hold
// that a lease registers for again within the grace keeps it.
func TestLostHoldIsReaped(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	b, obs, r, g := ownedGrant(t)
	r.Fence = g.Fence
	children := awaitQueue(t, obs, b.KeyPath(r.Key), 1)
	node := b.KeyPath(r.Key) + "/" + children[0]

	// A second lease of the same grant (a Client's nested hold) registers
	// right after the first one ended: the node stays.
	stop1 := b.NotifyLoss(r, func(error) {})
	stop1()
	stop2 := b.NotifyLoss(r, func(err error) { t.Errorf("second lease reported lost: %v", err) })
	locktest.WaitFor(t, 10*time.Second, "the reap scheduled at the first lease's end kept the node", func() bool { return b.ReapsKept() == 1 })
	if ok, _, err := obs.Exists(node); err != nil || !ok {
		t.Fatalf("node while a lease is registered: exists %v, %v; want it", ok, err)
	}
	stop2()
	awaitGone(t, obs, node)
	if err := b.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release after the reap: got %v, want ErrNotHeld", err)
	}
}

// awaitGone waits, with an existence watch, until the node at path is
// deleted.
func awaitGone(t *testing.T, conn *zk.Conn, path string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ok, _, ch, err := conn.ExistsW(path)
		if err != nil {
			t.Fatalf("ExistsW(%s): %v", path, err)
		}
		if !ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s still exists after 10s", path)
		}
	}
}

// TestCancelledReentryKeepsHold: re-entries and fresh attempts by the
// holding token whose context ends at any point leave the held node and
// its count as they were; a non-reentrant attempt by the holding token is
// not granted; Refresh and Release with another fence change nothing.
func TestCancelledReentryKeepsHold(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	b, obs, r, g := ownedGrant(t)
	held := awaitQueue(t, obs, b.KeyPath(r.Key), 1)[0]
	for i := range 50 {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(i)*20*time.Microsecond)
		attempt := r
		attempt.Reentrant = i%2 == 0
		if g, err := b.Wait(cctx, attempt); err == nil && g.OK {
			if !attempt.Reentrant {
				t.Fatalf("attempt %d: non-reentrant Wait by the holder granted: %+v", i, g)
			}
			attempt.Fence = g.Fence
			if err := b.Release(ctx, attempt); err != nil {
				t.Fatalf("attempt %d: Release of the re-entry: %v", i, err)
			}
		}
		cancel()
		if g, err := b.TryAcquire(ctx, dlock.Request{Key: r.Key, Token: r.Token, TTL: r.TTL}); err != nil || g.OK {
			t.Fatalf("attempt %d: non-reentrant TryAcquire by the holder: got %+v, %v, want not granted", i, g, err)
		}
	}
	stale := r
	stale.Fence = g.Fence + 1
	if err := b.Refresh(ctx, stale); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh with another fence: got %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, stale); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release with another fence: got %v, want ErrNotHeld", err)
	}
	// Only the held node is left, and one Release frees it.
	children := awaitQueue(t, obs, b.KeyPath(r.Key), 1)
	if children[0] != held {
		t.Fatalf("queue: got %v, want only the held node %s", children, held)
	}
	r.Fence = g.Fence
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	awaitGone(t, obs, b.KeyPath(r.Key)+"/"+held)
}

// ownedGrant takes a new key reentrantly for the token "job-1" (TTL 2s)
// through a Backend on a 2s session. It returns the Backend, an observer
// connection, the request and its grant.
func ownedGrant(t *testing.T) (*zklock.Backend, *zk.Conn, dlock.Request, dlock.Grant) {
	t.Helper()
	_, b := connect(t, zkServer.Addr(), 2*time.Second)
	obs := observer(t, zkServer.Addr())
	r := dlock.Request{Key: locktest.Key(t), Token: "job-1", TTL: 2 * time.Second, Reentrant: true}
	g, err := b.TryAcquire(locktest.Ctx(t, time.Minute), r)
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire: got %+v, %v, want a grant", g, err)
	}
	return b, obs, r, g
}
