package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// newBackend returns a Backend on a new etcd connection, closed when the
// test ends.
func newBackend(t *testing.T) (*etcdlock.Backend, *clientv3.Client) {
	t.Helper()
	cli := newCli(t, srv.Endpoints())
	b := etcdlock.New(cli)
	t.Cleanup(func() { b.Close() })
	return b, cli
}

// ownerReq is a reentrant request of the owner id of the test for key.
func ownerReq(t *testing.T, key string, ttl time.Duration) dlock.Request {
	return dlock.Request{Key: key, Token: "owner-" + key, TTL: ttl, Reentrant: true}
}

// mustTry takes r through b and returns the grant.
func mustTry(t *testing.T, b *etcdlock.Backend, r dlock.Request) dlock.Grant {
	t.Helper()
	g, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), r)
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire(%q, %q): got %+v, %v, want granted", r.Key, r.Token, g, err)
	}
	return g
}

// rawEntry reads the etcd key of (key, token) as b names it.
func rawEntry(t *testing.T, cli *clientv3.Client, b *etcdlock.Backend, key, token string) (createRev int64, value string, leaseTTL int64) {
	t.Helper()
	resp, err := cli.Get(locktest.Ctx(t, 5*time.Second), b.LockKey(key, token))
	if err != nil {
		t.Fatalf("get entry of %q: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, "", 0
	}
	kv := resp.Kvs[0]
	if kv.Lease != 0 {
		tr, err := cli.TimeToLive(locktest.Ctx(t, 5*time.Second), clientv3.LeaseID(kv.Lease))
		if err != nil {
			t.Fatalf("TimeToLive(%x): %v", kv.Lease, err)
		}
		leaseTTL = tr.GrantedTTL
	}
	return kv.CreateRevision, string(kv.Value), leaseTTL
}

// assertHeldBy checks that key is held on the server by r's grant g: the
// entry exists at g's fence, another owner cannot take it and r's grant
// can be refreshed.
func assertHeldBy(t *testing.T, b *etcdlock.Backend, cli *clientv3.Client, r dlock.Request, g dlock.Grant, what string) {
	t.Helper()
	if rev, _, _ := rawEntry(t, cli, b, r.Key, r.Token); rev != int64(g.Fence) {
		t.Fatalf("%s: entry create revision %d, want %d (the held grant)", what, rev, g.Fence)
	}
	other, _ := newBackend(t)
	og, err := other.TryAcquire(locktest.Ctx(t, 10*time.Second), dlock.Request{Key: r.Key, Token: "intruder", TTL: ttl})
	if err != nil || og.OK {
		t.Fatalf("%s: another owner's TryAcquire: got %+v, %v, want not granted", what, og, err)
	}
	rr := r
	rr.Fence = g.Fence
	if err := b.Refresh(locktest.Ctx(t, 10*time.Second), rr); err != nil {
		t.Fatalf("%s: Refresh of the held grant: %v", what, err)
	}
}

// A re-entry by the holding owner whose context ends before the server
// answers (at various points of the call) leaves the held entry alone
// (TryAcquire and Wait).
func TestCancelledReentryKeepsHeldEntry(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait bool
	}{{"TryAcquire", false}, {"Wait", true}} {
		t.Run(tc.name, func(t *testing.T) {
			key := locktest.Key(t)
			b, cli := newBackend(t)
			r := ownerReq(t, key, ttl)
			g := mustTry(t, b, r)
			for i := range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*50*time.Microsecond)
				var (
					g2  dlock.Grant
					err error
				)
				if tc.wait {
					g2, err = b.Wait(ctx, r)
				} else {
					g2, err = b.TryAcquire(ctx, r)
				}
				cancel()
				if err == nil {
					// The re-entry was granted before the context ended:
					// give it back.
					r2 := r
					r2.Fence = g2.Fence
					if err := b.Release(locktest.Ctx(t, 5*time.Second), r2); err != nil {
						t.Fatalf("Release of re-entry %d: %v", i, err)
					}
				}
				assertHeldBy(t, b, cli, r, g, fmt.Sprintf("after re-entry %d ended after %v (%v)", i, time.Duration(i)*50*time.Microsecond, err))
			}
			// Whatever the cancelled re-entries left raised on the server,
			// the lock is free about one TTL after the owner's last
			// release, although b renews another lock meanwhile.
			other := locktest.Key(t) + ".other"
			ro := dlock.Request{Key: other, Token: "tok-" + other, TTL: ttl}
			ro.Fence = mustTry(t, b, ro).Fence
			r.Fence = g.Fence
			if err := b.Release(locktest.Ctx(t, 5*time.Second), r); err != nil {
				t.Fatalf("Release: %v", err)
			}
			awaitFreeWhileRenewing(t, b, key, ro, time.Now())
		})
	}
}

// A non-reentrant attempt by a token that holds the lock is not granted,
// and its clean-up (context ended) leaves the held entry alone.
func TestNonReentrantSameTokenRefused(t *testing.T) {
	key := locktest.Key(t)
	b, cli := newBackend(t)
	r := dlock.Request{Key: key, Token: "tok-" + key, TTL: ttl}
	g := mustTry(t, b, r)
	if g2, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), r); err == nil && g2.OK {
		t.Fatalf("second non-reentrant TryAcquire by the holder: got %+v, want not granted", g2)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.TryAcquire(ctx, r); err == nil {
		t.Fatal("TryAcquire with an ended context: got nil error")
	}
	assertHeldBy(t, b, cli, r, g, "after refused attempts by the holding token")
}

// A hold count left raised by a re-entry whose reply was lost (simulated
// here by raising the count on the server directly) does not keep the
// lock alive once the owner released what it tracks, even while the
// Backend keeps renewing another lock: the lock is free within about one
// TTL of the owner's last renewal.
func TestOrphanedCountExpires(t *testing.T) {
	key, other := locktest.Key(t), locktest.Key(t)
	b, cli := newBackend(t)
	r := ownerReq(t, key, ttl)
	g := mustTry(t, b, r)
	ro := dlock.Request{Key: other, Token: "tok-" + other, TTL: ttl}
	ro.Fence = mustTry(t, b, ro).Fence

	// The lost re-entry: the count on the server is one above what b knows.
	name := b.LockKey(key, r.Token)
	if _, err := cli.Put(locktest.Ctx(t, 5*time.Second), name, "2 "+r.Token, clientv3.WithIgnoreLease()); err != nil {
		t.Fatal(err)
	}
	r.Fence = g.Fence
	if err := b.Release(locktest.Ctx(t, 5*time.Second), r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	released := time.Now()

	awaitFreeWhileRenewing(t, b, key, ro, released)
}

// awaitFreeWhileRenewing keeps ro renewed through b, as a watchdog would,
// until another owner can take key, and fails if that takes more than a
// few TTLs after since.
func awaitFreeWhileRenewing(t *testing.T, b *etcdlock.Backend, key string, ro dlock.Request, since time.Time) {
	t.Helper()
	intruder := dlock.Request{Key: key, Token: "intruder", TTL: ttl}
	o, cli := newBackend(t)
	deadline := since.Add(4 * ttl)
	renewUntil(t, b, ro, ttl/6, func() bool { // at twice a watchdog's rate
		gi, err := o.TryAcquire(locktest.Ctx(t, 5*time.Second), intruder)
		if err != nil {
			t.Fatalf("TryAcquire by another owner: %v", err)
		}
		if gi.OK {
			t.Logf("free %v after the owner's release", time.Since(since).Round(10*time.Millisecond))
			intruder.Fence = gi.Fence
			if err := o.Release(locktest.Ctx(t, 5*time.Second), intruder); err != nil {
				t.Fatalf("Release by the other owner: %v", err)
			}
			return true
		}
		if time.Now().After(deadline) {
			resp, _ := cli.Get(locktest.Ctx(t, 5*time.Second), b.LockKey(key, "owner-"+key))
			t.Fatalf("lock still held (%v) %v after the owner's last release while the Backend renews another lock; want free within about one TTL (%v)", resp.Kvs, 4*ttl, ttl)
		}
		return false
	})
}

// renewUntil refreshes r through b every period, as a watchdog would,
// until done, called after each renewal, returns true. It fails the test
// if a Refresh fails.
func renewUntil(t *testing.T, b *etcdlock.Backend, r dlock.Request, period time.Duration, done func() bool) {
	t.Helper()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		if err := b.Refresh(locktest.Ctx(t, 5*time.Second), r); err != nil {
			t.Fatalf("Refresh of %q: %v", r.Key, err)
		}
		if done() {
			return
		}
		<-tick.C
	}
}

// A Refresh with a shorter TTL never shortens the lock on the server: its
// entry stays on a lease at least as long as the one it had.
func TestRefreshShorterKeepsLongerLease(t *testing.T) {
	for _, tc := range []struct {
		name      string
		reentrant bool
	}{{"token", false}, {"owner", true}} {
		t.Run(tc.name, func(t *testing.T) {
			key := locktest.Key(t)
			b, cli := newBackend(t)
			r := dlock.Request{Key: key, Token: "tok-" + key, TTL: 5 * time.Second, Reentrant: tc.reentrant}
			r.Fence = mustTry(t, b, r).Fence
			short := r
			short.TTL = ttl
			if err := b.Refresh(locktest.Ctx(t, 10*time.Second), short); err != nil {
				t.Fatalf("Refresh(%v): %v", short.TTL, err)
			}
			if rev, _, lt := rawEntry(t, cli, b, key, r.Token); rev != int64(r.Fence) || lt < 5 {
				t.Fatalf("after Refresh to %v: entry at %d on a lease of %ds, want %d on a lease of at least 5s", short.TTL, rev, lt, r.Fence)
			}
		})
	}
}

// A re-entry or Refresh with a longer TTL lengthens the lock on the server:
// its entry moves to a lease at least that long.
func TestLongerTTLLengthensLease(t *testing.T) {
	key := locktest.Key(t)
	b, cli := newBackend(t)
	r := ownerReq(t, key, ttl)
	g := mustTry(t, b, r)

	// Server-side re-entry from another Backend (another process sharing
	// the owner id) with a longer TTL.
	b2, _ := newBackend(t)
	long := r
	long.TTL = 6 * time.Second
	g2 := mustTry(t, b2, long)
	if g2.Fence != g.Fence || g2.Count != 2 {
		t.Fatalf("re-entry: got fence %d count %d, want fence %d count 2", g2.Fence, g2.Count, g.Fence)
	}
	if rev, _, lt := rawEntry(t, cli, b, key, r.Token); rev != int64(g.Fence) || lt < 6 {
		t.Fatalf("after a re-entry with TTL %v: entry at %d on a lease of %ds, want %d on at least 6s", long.TTL, rev, lt, g.Fence)
	}
	// Both holders keep renewing the lock where it now is.
	r.Fence, long.Fence = g.Fence, g.Fence
	holders := []struct {
		b *etcdlock.Backend
		r dlock.Request
	}{{b, r}, {b2, long}}
	for _, x := range holders {
		if err := x.b.Refresh(locktest.Ctx(t, 10*time.Second), x.r); err != nil {
			t.Fatalf("Refresh after the move: %v", err)
		}
	}
	longer := r
	longer.TTL = 8 * time.Second
	if err := b.Refresh(locktest.Ctx(t, 10*time.Second), longer); err != nil {
		t.Fatalf("Refresh(%v): %v", longer.TTL, err)
	}
	if rev, _, lt := rawEntry(t, cli, b, key, r.Token); rev != int64(g.Fence) || lt < 8 {
		t.Fatalf("after Refresh to %v: entry at %d on a lease of %ds, want %d on at least 8s", longer.TTL, rev, lt, g.Fence)
	}
	if err := b2.Refresh(locktest.Ctx(t, 10*time.Second), long); err != nil {
		t.Fatalf("Refresh by the other holder after the second move: %v", err)
	}
	for _, x := range holders {
		if err := x.b.Release(locktest.Ctx(t, 10*time.Second), x.r); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	if rev, _, _ := rawEntry(t, cli, b, key, r.Token); rev != 0 {
		t.Fatalf("after both releases: entry still at %d", rev)
	}
}

// Refresh and Release compare the fence: a request carrying another
// grant's fence changes nothing and matches dlock.ErrNotHeld; fence 0
// names the token's grant, whichever it is.
func TestFenceMismatch(t *testing.T) {
	key := locktest.Key(t)
	b, cli := newBackend(t)
	r := ownerReq(t, key, ttl)
	g := mustTry(t, b, r)
	bad := r
	bad.Fence = g.Fence + 1
	if err := b.Refresh(locktest.Ctx(t, 5*time.Second), bad); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh with fence %d: got %v, want ErrNotHeld", bad.Fence, err)
	}
	if err := b.Release(locktest.Ctx(t, 5*time.Second), bad); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Release with fence %d: got %v, want ErrNotHeld", bad.Fence, err)
	}
	assertHeldBy(t, b, cli, r, g, "after mismatched fences")

	// Fence 0: whichever grant the token holds.
	if err := b.Refresh(locktest.Ctx(t, 5*time.Second), r); err != nil {
		t.Errorf("Refresh with fence 0: %v", err)
	}
	if err := b.Release(locktest.Ctx(t, 5*time.Second), r); err != nil {
		t.Errorf("Release with fence 0: %v", err)
	}
	if rev, _, _ := rawEntry(t, cli, b, key, r.Token); rev != 0 {
		t.Errorf("after Release with fence 0: entry still at %d", rev)
	}
}

// The Backend reports its TTL floor (dlock.TTLFloor), and a keep-alive
// round trip fits its renewal period many times over: TestMinTTLMargin
// logs the measured round trips behind MinTTL.
func TestMinTTLMargin(t *testing.T) {
	b, cli := newBackend(t)
	var floor dlock.TTLFloor = b
	if got := floor.MinTTL(); got != etcdlock.MinTTL {
		t.Fatalf("MinTTL: got %v, want %v", got, etcdlock.MinTTL)
	}
	lg, err := cli.Grant(locktest.Ctx(t, 5*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	// etcd raises a lease TTL below its minimum (1.5 × election timeout,
	// rounded up to whole seconds) to that minimum.
	if got := time.Duration(lg.TTL) * time.Second; got > etcdlock.MinTTL {
		t.Errorf("etcd granted %v for 1s, above MinTTL %v", got, etcdlock.MinTTL)
	}
	const n = 200
	rtts := make([]time.Duration, n)
	for i := range rtts {
		start := time.Now()
		if _, err := cli.KeepAliveOnce(locktest.Ctx(t, 5*time.Second), lg.ID); err != nil {
			t.Fatal(err)
		}
		rtts[i] = time.Since(start)
	}
	slices.Sort(rtts)
	p99 := rtts[n*99/100]
	t.Logf("granted TTL for 1s: %ds; keep-alive round trip: median %v, p99 %v, max %v; renewal period MinTTL/3 = %v",
		lg.TTL, rtts[n/2], p99, rtts[n-1], etcdlock.MinTTL/3)
	if p99 >= etcdlock.MinTTL/3 {
		t.Errorf("keep-alive p99 %v does not fit the renewal period %v", p99, etcdlock.MinTTL/3)
	}
}

// Close takes back only the closing Backend's holds of an owner's entry:
// alone, the entry is deleted at once; shared with another Backend of the
// same owner, the entry stays, held and renewable by the other one.
func TestCloseTakesBackOwnHolds(t *testing.T) {
	key := locktest.Key(t)
	cli := newCli(t, srv.Endpoints())
	b1 := etcdlock.New(cli)
	b2, _ := newBackend(t)
	r := ownerReq(t, key, 5*time.Second)
	g := mustTry(t, b1, r)
	mustTry(t, b2, r)
	if err := b1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rev, v, _ := rawEntry(t, cli, b2, key, r.Token)
	if rev != int64(g.Fence) || v != "1 "+r.Token {
		t.Fatalf("after closing one of two holders: entry at %d with %q, want %d with %q", rev, v, g.Fence, "1 "+r.Token)
	}
	r.Fence = g.Fence
	if err := b2.Refresh(locktest.Ctx(t, 5*time.Second), r); err != nil {
		t.Fatalf("Refresh by the other holder: %v", err)
	}

	b3 := etcdlock.New(cli)
	key2 := locktest.Key(t) + ".alone"
	mustTry(t, b3, ownerReq(t, key2, 5*time.Second))
	if err := b3.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if rev, _, _ := rawEntry(t, cli, b3, key2, "owner-"+key2); rev != 0 {
		t.Fatalf("after closing the only holder: entry still at %d, want deleted", rev)
	}
}
