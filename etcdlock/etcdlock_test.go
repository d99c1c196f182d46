package etcdlock_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// entry reads the etcd key of lease l.
func entry(t testing.TB, cli *clientv3.Client, b *etcdlock.Backend, l *dlock.Lease) (exists bool, createRev, leaseID int64, value string) {
	t.Helper()
	resp, err := cli.Get(locktest.Ctx(t, 5*time.Second), b.LockKey(l.Key(), l.Owner()))
	if err != nil {
		t.Fatalf("get entry of %q: %v", l.Key(), err)
	}
	if len(resp.Kvs) == 0 {
		return false, 0, 0, ""
	}
	kv := resp.Kvs[0]
	return true, kv.CreateRevision, kv.Lease, string(kv.Value)
}

// TestReleaseNeverDeletesNewerIncarnation: the holder's lease is revoked,
// the same owner takes the lock again through another connection (the
// same etcd key, a newer create revision), and the old hold's Release must
// leave the new incarnation alone (etcd issue #22082).
func TestReleaseNeverDeletesNewerIncarnation(t *testing.T) {
	key := locktest.Key(t)
	owner := "owner-" + rand.Text()[:8]
	cli := newCli(t, srv.Endpoints())
	oldC, oldB := newClient(t, srv.Endpoints(), dlock.WithOwner(owner))
	old := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), oldC, key)
	_, oldRev, leaseID, _ := entry(t, cli, oldB, old)
	if _, err := cli.Revoke(locktest.Ctx(t, 5*time.Second), clientv3.LeaseID(leaseID)); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	select {
	case <-old.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("revoked lease: Done not closed within 2s")
	}
	if err := old.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err after revocation: got %v, want ErrLost", err)
	}

	newC, newB := newClient(t, srv.Endpoints(), dlock.WithOwner(owner))
	cur := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), newC, key)
	defer cur.Release(context.Background())
	if oldB.LockKey(key, owner) != newB.LockKey(key, owner) {
		t.Fatalf("LockKey: got %q and %q, want the same etcd key", oldB.LockKey(key, owner), newB.LockKey(key, owner))
	}
	if cur.Fence() <= old.Fence() {
		t.Fatalf("new fence: got %d, want > %d", cur.Fence(), old.Fence())
	}

	// The stale release, straight at the backend and through the lease.
	req := dlock.Request{Key: key, Token: owner, TTL: ttl, Reentrant: true, Fence: uint64(oldRev)}
	if err := oldB.Release(locktest.Ctx(t, 5*time.Second), req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Backend.Release with the old fence: got %v, want ErrNotHeld", err)
	}
	req.Reentrant = false
	if err := oldB.Release(locktest.Ctx(t, 5*time.Second), req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Backend.Release (not reentrant) with the old fence: got %v, want ErrNotHeld", err)
	}
	if err := oldB.Refresh(locktest.Ctx(t, 5*time.Second), req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Backend.Refresh with the old fence: got %v, want ErrNotHeld", err)
	}
	if err := old.Release(locktest.Ctx(t, 5*time.Second)); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Lease.Release of the lost lease: got %v, want ErrLost", err)
	}
	exists, rev, _, _ := entry(t, cli, newB, cur)
	if !exists || uint64(rev) != cur.Fence() {
		t.Fatalf("new incarnation after the stale releases: exists=%v create revision %d, want true and %d", exists, rev, cur.Fence())
	}
	if err := cur.Err(); err != nil {
		t.Fatalf("new holder: Err %v, want nil", err)
	}
}

// TestLeaseRevokedAllLost: locks of one Backend share one lease; revoking
// it reports every one of them lost, Refresh says ErrNotHeld, and the
// Backend grants itself a new lease for later acquisitions.
func TestLeaseRevokedAllLost(t *testing.T) {
	cli := newCli(t, srv.Endpoints())
	c, b := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 10*time.Second)
	var leases []*dlock.Lease
	var leaseID int64
	for i := range 3 {
		l, err := c.Acquire(ctx, fmt.Sprintf("%s.%d", locktest.Key(t), i))
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		leases = append(leases, l)
		_, _, id, _ := entry(t, cli, b, l)
		if i > 0 && id != leaseID {
			t.Fatalf("lock %d: lease %x, want the shared lease %x", i, id, leaseID)
		}
		leaseID = id
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(leaseID)); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	for i, l := range leases {
		select {
		case <-l.Done():
		case <-time.After(2 * time.Second):
			t.Fatalf("lock %d: Done not closed within 2s of the revocation", i)
		}
		if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("lock %d: Err got %v, want ErrLost", i, err)
		}
		req := dlock.Request{Key: l.Key(), Token: l.Owner(), TTL: ttl, Fence: l.Fence()}
		if err := b.Refresh(ctx, req); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("lock %d: Refresh got %v, want ErrNotHeld", i, err)
		}
	}
	l := locktest.MustAcquire(t, ctx, c, locktest.Key(t))
	defer l.Release(context.Background())
	if _, _, id, _ := entry(t, cli, b, l); id == leaseID || id == 0 {
		t.Fatalf("lease after revocation: got %x, want a new lease (old %x)", id, leaseID)
	}
}

// TestOneLeasePerTTL: locks with the same TTL in seconds share a lease,
// another TTL gets another lease, TTLs are rounded up to whole seconds,
// and a Refresh with a new TTL moves the lock to that TTL's lease.
func TestOneLeasePerTTL(t *testing.T) {
	cli := newCli(t, srv.Endpoints())
	c, b := newClient(t, srv.Endpoints(), dlock.WithAutoRenew(false))
	ctx := locktest.Ctx(t, 10*time.Second)
	acquire := func(ttl time.Duration) (*dlock.Lease, int64) {
		t.Helper()
		l, err := c.Acquire(ctx, locktest.Key(t), dlock.WithTTL(ttl))
		if err != nil {
			t.Fatalf("Acquire(TTL %v): %v", ttl, err)
		}
		t.Cleanup(func() { l.Release(context.Background()) })
		_, _, id, _ := entry(t, cli, b, l)
		return l, id
	}
	granted := func(id int64) int64 {
		t.Helper()
		resp, err := cli.TimeToLive(ctx, clientv3.LeaseID(id))
		if err != nil {
			t.Fatalf("TimeToLive(%x): %v", id, err)
		}
		return resp.GrantedTTL
	}
	_, a := acquire(3 * time.Second)
	_, a2 := acquire(2500 * time.Millisecond) // rounds up to 3 s
	l3, c3 := acquire(4 * time.Second)
	if a != a2 {
		t.Fatalf("TTLs 3s and 2.5s: leases %x and %x, want one shared lease", a, a2)
	}
	if a == c3 {
		t.Fatalf("TTLs 3s and 4s: both on lease %x, want two leases", a)
	}
	if got := granted(a); got != 3 {
		t.Fatalf("granted TTL of the 2.5s/3s lease: got %d, want 3", got)
	}
	if err := l3.Refresh(ctx, 5*time.Second); err != nil {
		t.Fatalf("Refresh(5s): %v", err)
	}
	_, _, moved, _ := entry(t, cli, b, l3)
	if moved == c3 || moved == a {
		t.Fatalf("lease after Refresh(5s): got %x, want a new lease", moved)
	}
	if got := granted(moved); got != 5 {
		t.Fatalf("granted TTL after Refresh(5s): got %d, want 5", got)
	}
}

// TestMinTTL: below etcd's minimum the error names the minimum.
func TestMinTTL(t *testing.T) {
	c, b := newClient(t, srv.Endpoints())
	_, err := c.Acquire(locktest.Ctx(t, 5*time.Second), locktest.Key(t), dlock.WithTTL(1500*time.Millisecond))
	if !errors.Is(err, dlock.ErrInvalidTTL) || !strings.Contains(err.Error(), etcdlock.MinTTL.String()) {
		t.Fatalf("Acquire with TTL 1.5s: got %v, want ErrInvalidTTL naming %v", err, etcdlock.MinTTL)
	}
	_, err = b.TryAcquire(locktest.Ctx(t, 5*time.Second), dlock.Request{Key: "k", Token: "t", TTL: time.Second})
	if !errors.Is(err, dlock.ErrInvalidTTL) || !strings.HasPrefix(err.Error(), "etcdlock: ") {
		t.Fatalf("TryAcquire with TTL 1s: got %v, want an etcdlock error matching ErrInvalidTTL", err)
	}
}

// TestGuard: the comparison passes while the lease is held and fails once
// the lock was released or taken over.
func TestGuard(t *testing.T) {
	cli := newCli(t, srv.Endpoints())
	c, b := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 10*time.Second)
	key := locktest.Key(t)
	res := "/resource/" + key
	var writeVia func(b *etcdlock.Backend, l *dlock.Lease, v string) bool
	write := func(l *dlock.Lease, v string) bool {
		t.Helper()
		return writeVia(b, l, v)
	}
	writeVia = func(b *etcdlock.Backend, l *dlock.Lease, v string) bool {
		t.Helper()
		resp, err := cli.Txn(ctx).If(b.Guard(l)).Then(clientv3.OpPut(res, v)).Commit()
		if err != nil {
			t.Fatalf("guarded Txn: %v", err)
		}
		return resp.Succeeded
	}
	l := locktest.MustAcquire(t, ctx, c, key)
	if !write(l, "1") {
		t.Fatal("guarded write while holding: got refused, want applied")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if write(l, "2") {
		t.Fatal("guarded write after Release: got applied, want refused")
	}
	c2, b2 := newClient(t, srv.Endpoints())
	l2 := locktest.MustAcquire(t, ctx, c2, key)
	defer l2.Release(context.Background())
	if write(l, "3") {
		t.Fatal("guarded write with the old lease while another holds the lock: got applied, want refused")
	}
	// A non-reentrant lease's entry is named after the Backend that
	// granted it: another Backend's guard refuses (never wrongly allows).
	if write(l2, "x") {
		t.Fatal("guarded write by the new holder, guard from another Backend: got applied, want refused")
	}
	if !writeVia(b2, l2, "4") {
		t.Fatal("guarded write by the new holder: got refused, want applied")
	}
	if write(nil, "5") {
		t.Fatal("guarded write with a nil lease: got applied, want refused")
	}
	resp, err := cli.Get(ctx, res)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "4" {
		t.Fatalf("resource: got %v (err %v), want value 4", resp.Kvs, err)
	}
}

// TestTryAcquireWritesNothing: a failed TryAcquire leaves the store's
// revision unchanged (no transient queue entry).
func TestTryAcquireWritesNothing(t *testing.T) {
	cli := newCli(t, srv.Endpoints())
	key := locktest.Key(t)
	a, _ := newClient(t, srv.Endpoints())
	l := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), a, key)
	defer l.Release(context.Background())
	b := etcdlock.New(newCli(t, srv.Endpoints()))
	defer b.Close()
	req := dlock.Request{Key: key, Token: "other", TTL: ttl}
	// Grant the second Backend's lease first: a grant is not a write, but
	// keep the measured call to the TryAcquire itself.
	if _, err := b.TryAcquire(locktest.Ctx(t, 5*time.Second), req); err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	before, err := cli.Get(locktest.Ctx(t, 5*time.Second), "any")
	if err != nil {
		t.Fatal(err)
	}
	g, err := b.TryAcquire(locktest.Ctx(t, 5*time.Second), req)
	if err != nil || g.OK {
		t.Fatalf("TryAcquire on a held lock: got %+v, %v, want not OK and no error", g, err)
	}
	after, err := cli.Get(locktest.Ctx(t, 5*time.Second), "any")
	if err != nil {
		t.Fatal(err)
	}
	if before.Header.Revision != after.Header.Revision {
		t.Fatalf("store revision: got %d after a failed TryAcquire, want %d (no write)", after.Header.Revision, before.Header.Revision)
	}
}

// TestKeysAreEscaped: the lock "a" is not held by the lock "a/b".
func TestKeysAreEscaped(t *testing.T) {
	c, b := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 10*time.Second)
	base := locktest.Key(t)
	inner, err := c.Acquire(ctx, base+"/b")
	if err != nil {
		t.Fatalf("Acquire %q: %v", base+"/b", err)
	}
	defer inner.Release(context.Background())
	c2, _ := newClient(t, srv.Endpoints())
	outer, err := c2.TryAcquire(ctx, base)
	if err != nil {
		t.Fatalf("TryAcquire %q while %q is held: %v", base, base+"/b", err)
	}
	defer outer.Release(context.Background())
	if got, want := b.LockKey(base+"/b%", "x"), etcdlock.DefaultPrefix+base+"%2Fb%25/"; !strings.HasPrefix(got, want) {
		t.Fatalf("LockKey: got %q, want prefix %q", got, want)
	}
}

// TestReentrantCount: holds of one owner through two Clients (two
// processes sharing the owner id) share the fence and keep their count in
// the entry's value.
func TestReentrantCount(t *testing.T) {
	cli := newCli(t, srv.Endpoints())
	owner := "job-" + rand.Text()[:6]
	c, b := newClient(t, srv.Endpoints(), dlock.WithOwner(owner))
	c2, _ := newClient(t, srv.Endpoints(), dlock.WithOwner(owner))
	ctx := locktest.Ctx(t, 10*time.Second)
	key := locktest.Key(t)
	l1 := locktest.MustAcquire(t, ctx, c, key)
	l2, err := c2.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("nested Acquire: %v", err)
	}
	if l1.Fence() != l2.Fence() || l2.Count() != 2 {
		t.Fatalf("nested hold: fence %d/%d count %d, want equal fences and count 2", l1.Fence(), l2.Fence(), l2.Count())
	}
	if _, _, _, v := entry(t, cli, b, l1); v != "2 "+owner {
		t.Fatalf("entry value: got %q, want %q", v, "2 "+owner)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatalf("Release nested: %v", err)
	}
	if _, _, _, v := entry(t, cli, b, l1); v != "1 "+owner {
		t.Fatalf("entry value after one release: got %q, want %q", v, "1 "+owner)
	}
	if err := l1.Err(); err != nil {
		t.Fatalf("outer hold after the nested release: Err %v, want nil", err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatalf("Release outer: %v", err)
	}
	if exists, _, _, _ := entry(t, cli, b, l1); exists {
		t.Fatal("entry after the last release: exists, want deleted")
	}
}

// TestAbandonedLockFreed: a lock the Client stops renewing is freed at its
// deadline even though the Backend's shared lease is kept alive by
// another lock.
func TestAbandonedLockFreed(t *testing.T) {
	c, _ := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 20*time.Second)
	keep, err := c.Acquire(ctx, locktest.Key(t)) // renewed: keeps the lease alive
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer keep.Release(context.Background())
	key := locktest.Key(t)
	l := locktest.MustAcquire(t, ctx, c, key, dlock.WithAutoRenew(false))
	<-l.Done()
	other, _ := newClient(t, srv.Endpoints())
	l2 := locktest.MustAcquire(t, ctx, other, key)
	defer l2.Release(context.Background())
	if late := time.Since(l.Expires()); late > 500*time.Millisecond {
		t.Fatalf("lock freed %v after the abandoned lease's Expires, want within 500ms", late)
	}
	if keep.Err() != nil {
		t.Fatalf("the renewed lock: Err %v, want nil", keep.Err())
	}
}

// TestOptions: invalid options and a nil client are reported by every
// call, never corrected.
func TestOptions(t *testing.T) {
	cli := newCli(t, srv.Endpoints())
	for name, b := range map[string]*etcdlock.Backend{
		"EmptyPrefix": etcdlock.New(cli, etcdlock.WithPrefix("")),
		"NilOption":   etcdlock.New(cli, nil),
		"NilClient":   etcdlock.New(nil),
	} {
		t.Run(name, func(t *testing.T) {
			if err := b.Err(); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("Err: got %v, want ErrInvalidOption", err)
			}
			_, err := b.TryAcquire(context.Background(), dlock.Request{Key: "k", Token: "t", TTL: ttl})
			if !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("TryAcquire: got %v, want ErrInvalidOption", err)
			}
			if err := b.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		})
	}
	b := etcdlock.New(cli, etcdlock.WithPrefix("/custom/"))
	defer b.Close()
	if got := b.LockKey("k", "t"); !strings.HasPrefix(got, "/custom/k/") {
		t.Fatalf("LockKey with WithPrefix: got %q, want prefix /custom/k/", got)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err := b.TryAcquire(context.Background(), dlock.Request{Key: "k", Token: "t", TTL: ttl})
	if !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryAcquire after Close: got %v, want ErrClosed", err)
	}
}

// TestCancelWhileServerPaused: a wait cancelled while the server does not
// answer returns promptly, and its entry is gone soon after the server is
// back (deleted in the background, or expired with its lease).
func TestCancelWhileServerPaused(t *testing.T) {
	key := locktest.Key(t)
	cli := newCli(t, srv.Endpoints())
	a, _ := newClient(t, srv.Endpoints(), dlock.WithTTL(30*time.Second))
	holder := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), a, key)
	defer holder.Release(context.Background())
	w, _ := newClient(t, srv.Endpoints())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := w.Acquire(ctx, key)
		done <- err
	}()
	locktest.WaitFor(t, 10*time.Second, "waiter queued", func() bool { return entries(t, cli, key) == 2 })
	if err := srv.Pause(); err != nil {
		t.Fatalf("pause: %v", err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := srv.Resume(); err != nil {
				t.Errorf("resume: %v", err)
			}
		}
	}
	defer resume()
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Acquire: got %v, want context.Canceled", err)
		}
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Fatalf("cancelled Acquire returned after %v with the server paused, want within 1.5s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled Acquire did not return within 5s with the server paused")
	}
	resume()
	locktest.WaitFor(t, ttl+cleanupSlack, "the cancelled waiter's entry removed", func() bool { return entries(t, cli, key) == 1 })
	if err := holder.Err(); err != nil {
		t.Fatalf("holder after the outage: Err %v, want nil (TTL 30s)", err)
	}
}

// cleanupSlack bounds how late after the server returns an entry left by
// a cancelled or failed call disappears.
const cleanupSlack = 3 * time.Second

// TestReentrantJoinWhileQueued: two waits of the same owner (through two
// Clients sharing the owner id) queued behind another owner share one entry; both are granted when the holder
// releases, with one fence, and the lock is free after both release.
func TestReentrantJoinWhileQueued(t *testing.T) {
	key := locktest.Key(t)
	cli := newCli(t, srv.Endpoints())
	a, _ := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 20*time.Second)
	holder := locktest.MustAcquire(t, ctx, a, key)
	owner := "job-" + rand.Text()[:6]
	c, b := newClient(t, srv.Endpoints(), dlock.WithOwner(owner))
	c2, _ := newClient(t, srv.Endpoints(), dlock.WithOwner(owner))
	w1 := locktest.Go(func() (*dlock.Lease, error) { return c.Acquire(ctx, key) })
	w2 := locktest.Go(func() (*dlock.Lease, error) { return c2.Acquire(ctx, key) })
	locktest.WaitFor(t, 10*time.Second, "both waits joined one entry", func() bool {
		resp, err := cli.Get(ctx, b.LockKey(key, owner))
		return err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == "2 "+owner
	})
	if n := entries(t, cli, key); n != 2 {
		t.Fatalf("entries: got %d, want 2 (holder and the owner's one entry)", n)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release holder: %v", err)
	}
	l1, l2 := locktest.Granted(t, w1, 10*time.Second), locktest.Granted(t, w2, 10*time.Second)
	if l1.Fence() != l2.Fence() || l1.Fence() <= holder.Fence() {
		t.Fatalf("fences: got %d and %d, want equal and > %d", l1.Fence(), l2.Fence(), holder.Fence())
	}
	for _, l := range []*dlock.Lease{l1, l2} {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release joined hold: %v", err)
		}
	}
	if n := entries(t, cli, key); n != 0 {
		t.Fatalf("entries after both releases: got %d, want 0", n)
	}
}
