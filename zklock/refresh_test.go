package zklock_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/zklock"
)

// TestRefreshManyFromWatches refreshes many watched locks: one sync for
// the batch and no request per lock; a node deleted by someone else is
// still reported (ErrNotHeld) by the next RefreshMany, whether or not the
// watch's event was handled before it, and the others stay held.
func TestRefreshManyFromWatches(t *testing.T) {
	const (
		n   = 50
		ttl = 10 * time.Second
	)
	counter := &opCounter{}
	_, b := connect(t, zkServer.Addr(), ttl, zklock.WithDialer(counter.dial))
	obs := observer(t, zkServer.Addr())
	ctx := locktest.Ctx(t, time.Minute)
	k := locktest.Key(t)
	rs := make([]dlock.Request, n)
	for i := range rs {
		rs[i] = dlock.Request{Key: fmt.Sprintf("%s.%d", k, i), Token: fmt.Sprintf("token-%d", i), TTL: ttl}
		g, err := b.Wait(ctx, rs[i])
		if err != nil || !g.OK {
			t.Fatalf("Wait %d: got %+v, %v, want a grant", i, g, err)
		}
		rs[i].Fence = g.Fence
	}
	t.Cleanup(func() {
		for _, r := range rs {
			b.Release(ctx, r)
		}
	})
	// The first refresh reads the nodes not watched yet, which watches them.
	for i, err := range b.RefreshMany(ctx, rs) {
		if err != nil {
			t.Fatalf("RefreshMany, lock %d: %v", i, err)
		}
	}
	locktest.WaitFor(t, 10*time.Second, "every lock watched after a refresh", func() bool {
		return !slices.ContainsFunc(rs, func(r dlock.Request) bool { return !b.Watched(r.Key) })
	})

	counter.Take()
	for i, err := range b.RefreshMany(ctx, rs) {
		if err != nil {
			t.Fatalf("RefreshMany, lock %d: %v", i, err)
		}
	}
	ops := counter.Take()
	delete(ops, opPing)
	if want := map[int32]int{opSync: 1}; !maps.Equal(ops, want) {
		t.Fatalf("requests for a RefreshMany of %d watched locks: got %v (by opcode), want %v", n, ops, want)
	}

	// Deleted by someone else: reported right after, event handled or not.
	for _, gone := range []int{7, 23} {
		path := b.KeyPath(rs[gone].Key)
		children, _, err := obs.Children(path)
		if err != nil || len(children) != 1 {
			t.Fatalf("Children(%s): got %v, %v, want one node", path, children, err)
		}
		if err := obs.Delete(path+"/"+children[0], -1); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		errs := b.RefreshMany(ctx, rs)
		if !errors.Is(errs[gone], dlock.ErrNotHeld) {
			t.Fatalf("RefreshMany of lock %d, whose node was deleted: got %v, want ErrNotHeld", gone, errs[gone])
		}
		for i, err := range errs {
			if err != nil && i != 7 && i != 23 {
				t.Fatalf("RefreshMany, lock %d: got %v, want nil", i, err)
			}
		}
	}
}
