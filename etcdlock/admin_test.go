package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// Inspect reports the holder (owner, fence, count, TTL left) and the
// number of queued waiters, and a free lock as not held.
func TestInspect(t *testing.T) {
	key := locktest.Key(t)
	b, _ := newBackend(t)
	info, err := b.Inspect(locktest.Ctx(t, 5*time.Second), key)
	if err != nil || info.Held || info.Key != key || info.Waiters != 0 {
		t.Fatalf("Inspect of a free lock: got %+v, %v, want not held, key %q, 0 waiters", info, err, key)
	}

	// Held by an owner twice (two Backends sharing the owner id).
	r := ownerReq(t, key, 5*time.Second)
	g := mustTry(t, b, r)
	b2, _ := newBackend(t)
	mustTry(t, b2, r)

	// Two waiters queued behind it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	for i := range 2 {
		w, _ := newBackend(t)
		go func() {
			_, err := w.Wait(ctx, dlock.Request{Key: key, Token: "waiter-" + string(rune('a'+i)), TTL: ttl})
			done <- err
		}()
	}
	cli := newCli(t, srv.Endpoints())
	locktest.WaitFor(t, 10*time.Second, "two waiters queued", func() bool { return entries(t, cli, key) == 3 })

	info, err = b.Inspect(locktest.Ctx(t, 5*time.Second), key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if !info.Held || info.Owner != r.Token || info.Fence != g.Fence || info.Count != 2 || info.Waiters != 2 {
		t.Errorf("Inspect: got %+v, want held by %q, fence %d, count 2, 2 waiters", info, r.Token, g.Fence)
	}
	if info.TTL <= 0 || info.TTL > 5*time.Second {
		t.Errorf("Inspect: TTL %v, want in (0, 5s]", info.TTL)
	}
	cancel()
	for range 2 {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Wait: got %v, want context.Canceled", err)
		}
	}
}

// ForceRelease removes the holder whoever it is: the holder's lease is
// reported lost (without a renewal of its own), the next waiter gets the
// lock, and a free lock is reported as nothing removed.
func TestForceRelease(t *testing.T) {
	key := locktest.Key(t)
	c, _ := newClient(t, srv.Endpoints())
	l := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), c, key)
	// A waiter on another Client.
	c2, _ := newClient(t, srv.Endpoints())
	wait := locktest.Go(func() (*dlock.Lease, error) { return c2.Acquire(locktest.Ctx(t, 30*time.Second), key) })
	cli := newCli(t, srv.Endpoints())
	locktest.WaitFor(t, 10*time.Second, "waiter queued", func() bool { return entries(t, cli, key) == 2 })

	admin, _ := newBackend(t)
	info, err := admin.ForceRelease(locktest.Ctx(t, 5*time.Second), key)
	if err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	if !info.Held || info.Owner != l.Owner() || info.Fence != l.Fence() || info.Count != 1 || info.Waiters != 1 {
		t.Errorf("ForceRelease: got %+v, want held by %q, fence %d, count 1, 1 waiter", info, l.Owner(), l.Fence())
	}
	select {
	case <-l.Done():
		if !errors.Is(l.Err(), dlock.ErrLost) {
			t.Errorf("holder's lease: got %v, want ErrLost", l.Err())
		}
	case <-time.After(time.Until(l.Expires())):
		t.Errorf("holder's lease not reported lost by its Expires, after a force release")
	}
	l2 := locktest.Granted(t, wait, 30*time.Second)
	if l2.Fence() <= l.Fence() {
		t.Errorf("waiter's fence %d, want above %d", l2.Fence(), l.Fence())
	}
	if err := l2.Release(locktest.Ctx(t, 5*time.Second)); err != nil {
		t.Errorf("waiter's Release: %v", err)
	}
	info, err = admin.ForceRelease(locktest.Ctx(t, 5*time.Second), key)
	if err != nil || info.Held {
		t.Errorf("ForceRelease of a free lock: got %+v, %v, want not held", info, err)
	}
}
