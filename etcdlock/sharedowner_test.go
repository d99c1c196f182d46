package etcdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// Two Backends of one owner hold the same entry; whatever one of them does
// with its own hold and leases (release, close, a longer TTL moving the
// entry), the other's hold stays on the server for as long as it renews
// it.
func TestSharedOwnerEntrySurvivesOtherBackend(t *testing.T) {
	type step func(t *testing.T, b1, b2 *etcdlock.Backend, r1, r2 dlock.Request)
	release := func(t *testing.T, b *etcdlock.Backend, r dlock.Request) {
		t.Helper()
		if err := b.Release(locktest.Ctx(t, 5*time.Second), r); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	closeB := func(t *testing.T, b *etcdlock.Backend) {
		t.Helper()
		if err := b.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	cases := []struct {
		name       string
		ttl1, ttl2 time.Duration
		after      step // what the first Backend does; the second keeps its hold
	}{
		{"close", ttl, ttl, func(t *testing.T, b1, b2 *etcdlock.Backend, r1, r2 dlock.Request) { closeB(t, b1) }},
		{"release-close", ttl, ttl, func(t *testing.T, b1, b2 *etcdlock.Backend, r1, r2 dlock.Request) {
			release(t, b1, r1)
			closeB(t, b1)
		}},
		{"longer-second-close", ttl, 2 * ttl, func(t *testing.T, b1, b2 *etcdlock.Backend, r1, r2 dlock.Request) { closeB(t, b1) }},
		{"longer-first-close", 2 * ttl, ttl, func(t *testing.T, b1, b2 *etcdlock.Backend, r1, r2 dlock.Request) { closeB(t, b1) }},
		{"longer-second-release-close", ttl, 2 * ttl, func(t *testing.T, b1, b2 *etcdlock.Backend, r1, r2 dlock.Request) {
			release(t, b1, r1)
			closeB(t, b1)
		}},
		{"reacquire-close", ttl, ttl, func(t *testing.T, b1, b2 *etcdlock.Backend, r1, r2 dlock.Request) {
			release(t, b1, r1)
			r := r1
			r.Fence = 0
			r.Fence = mustTry(t, b1, r).Fence
			release(t, b1, r)
			closeB(t, b1)
		}},
		{"longer-refresh-first-close", ttl, ttl, func(t *testing.T, b1, b2 *etcdlock.Backend, r1, r2 dlock.Request) {
			r := r1
			r.TTL = 3 * ttl
			if err := b1.Refresh(locktest.Ctx(t, 5*time.Second), r); err != nil {
				t.Fatal(err)
			}
			release(t, b1, r1)
			closeB(t, b1)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each mostly sleeps between renewals
			key := locktest.Key(t)
			cli := newCli(t, srv.Endpoints())
			b1 := etcdlock.New(cli)
			t.Cleanup(func() { b1.Close() })
			b2, _ := newBackend(t)
			r1, r2 := ownerReq(t, key, tc.ttl1), ownerReq(t, key, tc.ttl2)
			r1.Fence = mustTry(t, b1, r1).Fence
			g2 := mustTry(t, b2, r2)
			r2.Fence = g2.Fence
			tc.after(t, b1, b2, r1, r2)
			// b2 renews as its watchdog would, for longer than any lease
			// involved, and must hold the lock throughout.
			end := time.Now().Add(3*ttl + time.Second)
			renewUntil(t, b2, r2, r2.TTL/3, func() bool { return !time.Now().Before(end) })
			assertHeldBy(t, b2, cli, r2, g2, "after the other Backend's "+tc.name)
		})
	}
}

// A Release whose context ends mid-call (its decrement may or may not
// have been applied) never takes more than its own hold off an owner's
// entry that another Backend also holds.
func TestCutReleaseKeepsOtherHold(t *testing.T) {
	hits, applied := 0, 0
	for i := 0; i < 40; i++ {
		key := locktest.Key(t)
		b1, _ := newBackend(t)
		b2, cli := newBackend(t)
		r1, r2 := ownerReq(t, key, 3*ttl), ownerReq(t, key, 3*ttl)
		r1.Fence = mustTry(t, b1, r1).Fence
		g2 := mustTry(t, b2, r2)
		r2.Fence = g2.Fence
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i*50)*time.Microsecond)
		err := b1.Release(ctx, r1)
		cancel()
		if err != nil {
			hits++
		}
		locktest.WaitFor(t, 10*time.Second, "the background sweep done", func() bool { return etcdlock.Orphans(b1) == 0 })
		if rev, v, _ := rawEntry(t, cli, b2, key, r2.Token); rev != int64(g2.Fence) {
			t.Fatalf("cut after %v (Release: %v): the other Backend's entry is gone (at %d, %q)", time.Duration(i*50)*time.Microsecond, err, rev, v)
		} else if err != nil && v == "1 "+r2.Token {
			applied++ // cut, yet lowered: a retry would have taken b2's hold
		}
		b1.Close()
		b2.Close()
	}
	t.Logf("%d of 40 releases cut, %d of them applied on the server", hits, applied)
}
