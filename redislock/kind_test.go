package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/scale"
	"github.com/dlock-go/dlock/redislock"
)

// kindReq returns a request of kind k (a semaphore of permits permits)
// with a token of its own.
func kindReq(key, token string, k dlock.Kind, permits int, ttl time.Duration) dlock.Request {
	return dlock.Request{Key: key, Token: token, TTL: ttl, Kind: k, Permits: permits}
}

// TestKindCommands counts the server commands (EVALSHA and the
// redis.calls inside the scripts) of one uncontended TryAcquire + Release
// of a permit and of a read hold, alone on their key and next to another
// holder, and checks them against the figures in the package
// documentation.
func TestKindCommands(t *testing.T) {
	rdb, b, _ := onSrv(t)
	const cycles = 200
	cases := []struct {
		name    string
		kind    dlock.Kind
		permits int
		other   bool // another holder stays on the key meanwhile
		want    float64
	}{
		{"Lock", dlock.KindLock, 0, false, 6},
		{"Permit", dlock.KindPermit, 3, false, 10},
		{"PermitBesideAnother", dlock.KindPermit, 3, true, 13},
		{"Read", dlock.KindRead, 0, false, 10},
		{"ReadBesideAnother", dlock.KindRead, 0, true, 15},
	}
	for _, tc := range cases {
		k := key(t) + tc.name
		if tc.other {
			holding(t, b, kindReq(k, "other", tc.kind, tc.permits, time.Minute))
		}
		r := kindReq(k, "cycle", tc.kind, tc.permits, time.Minute)
		before := cmdCalls(t, rdb)
		for i := 0; i < cycles; i++ {
			mustRelease(t, b, holding(t, b, r))
		}
		// One INFO of the two is counted in the difference.
		got := float64(cmdCalls(t, rdb)-before-1) / cycles
		t.Logf("%s: %.2f server commands per acquire + release (load %s)", tc.name, got, scale.LoadAvg())
		if got > tc.want+0.05 {
			t.Errorf("%s: got %.2f server commands per cycle, want at most %v", tc.name, got, tc.want)
		}
	}
}

// TestKindNoKeysLeftBehind takes and releases permits, read holds (with a
// writer queued behind them) and a leadership on many keys, and lets
// others die without a release: every key is gone at once after the
// releases, and within the TTL (plus the queue's bound) for the rest.
func TestKindNoKeysLeftBehind(t *testing.T) {
	// A database of its own: DBSIZE counts only this test's keys.
	rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.DB = 8 })
	b := newBackend(t, rdb)
	ctx := ctxT(t, time.Minute)
	start := rdb.DBSize(ctx).Val()
	const n = 50
	prefix := key(t) + ":"
	var rs []dlock.Request
	for i := 0; i < n; i++ {
		for j, k := range []dlock.Kind{dlock.KindPermit, dlock.KindPermit, dlock.KindRead, dlock.KindRead} {
			rs = append(rs, holding(t, b, kindReq(prefix+strconv.Itoa(i)+k.String(), "t"+strconv.Itoa(j), k, 2, time.Minute)))
		}
	}
	if got := rdb.DBSize(ctx).Val() - start; got != 2*2*n {
		t.Fatalf("keys while held: got %d, want %d (a marker and the holds per key)", got, 4*n)
	}
	mustRelease(t, b, rs...)
	if got := rdb.DBSize(ctx).Val(); got != start {
		t.Fatalf("DBSIZE after the releases: got %d, want %d", got, start)
	}

	// A writer queued behind a reader, a writer's claim, a leader's value;
	// and holders that die without a release.
	const ttl = 300 * time.Millisecond
	c := dlock.New(b, dlock.WithTTL(ttl))
	defer c.Close()
	k := prefix + "rw"
	rl, err := c.RWLock(k).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := locktest.Go(func() (*dlock.Lease, error) { return c.RWLock(k).Lock(ctx) })
	waitFor(t, 5*time.Second, "the writer to queue", func() bool { return rdb.Exists(ctx, b.LockName(k)+":q").Val() == 1 })
	release(t, ctx, rl)
	release(t, ctx, locktest.Granted(t, w, 5*time.Second))
	claim := kindReq(prefix+"claim", "writer", dlock.KindLock, 0, time.Minute)
	claim.Waiting = true
	reader := holding(t, b, kindReq(claim.Key, "reader", dlock.KindRead, 0, time.Minute))
	if g, err := b.TryAcquire(ctx, claim); err != nil || g.OK {
		t.Fatalf("a writer behind a reader: %+v, %v; want not granted", g, err)
	}
	if err := b.Release(ctx, claim); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("withdrawal: got %v, want ErrNotHeld", err)
	}
	mustRelease(t, b, reader)
	lead, err := c.Election(prefix+"lead").Campaign(ctx, "me")
	if err != nil {
		t.Fatal(err)
	}
	release(t, ctx, lead)
	for i := 0; i < 3; i++ {
		if _, err := c.Semaphore(prefix+"dead", 3).Acquire(ctx, dlock.WithAutoRenew(false)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RWLock(prefix+"dead"+strconv.Itoa(i)).RLock(ctx, dlock.WithAutoRenew(false)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ttl+2*redislock.DefaultWaiterTTL+5*time.Second, "DBSIZE back to its start", func() bool { return rdb.DBSize(ctx).Val() == start })
}

// TestKindWriterQueued: a writer waiting in the lock's queue (the default
// wait) keeps new readers out; the last reader's release hands it the key
// with a fence above every reader's; a reader waiting behind the writer
// gets in after its release; a dead reader's hold lets the writer in
// within its TTL.
func TestKindWriterQueued(t *testing.T) {
	rdb := newRDB(t, srv.Addr())
	const ttl = 500 * time.Millisecond
	newC := func() *dlock.Client { return newClient(t, rdb, dlock.WithTTL(ttl)) }
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	r1, err := newC().RWLock(k).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wc := newC()
	writer := locktest.Go(func() (*dlock.Lease, error) { return wc.RWLock(k).Lock(ctx) })
	insp := newBackend(t, rdb)
	waitFor(t, 5*time.Second, "the writer to queue", func() bool {
		info, err := insp.Inspect(ctx, k)
		return err == nil && info.Waiters == 1
	})
	if info, err := insp.Inspect(ctx, k); err != nil || info.Kind != dlock.KindRead || len(info.Holds) != 1 || info.Holds[0].Owner != r1.Owner() || info.Holds[0].Fence != r1.Fence() {
		t.Fatalf("Inspect with one reader: got %+v, %v; want its read hold", info, err)
	}
	if _, err := newC().RWLock(k).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock while a writer is queued: got %v, want ErrNotAcquired", err)
	}
	release(t, ctx, r1)
	// Served once the last reader left.
	wl := locktest.Granted(t, writer, 5*time.Second)
	if wl.Fence() <= r1.Fence() {
		t.Fatalf("writer's fence %d, want above the reader's %d", wl.Fence(), r1.Fence())
	}
	rc := newC()
	reader := locktest.Go(func() (*dlock.Lease, error) { return rc.RWLock(k).RLock(ctx) })
	waitFor(t, 5*time.Second, "the reader to find the key held", func() bool {
		v, ok := readLock(t, rdb, insp, k)
		return ok && strings.Contains(v.Flags, "w")
	})
	release(t, ctx, wl)
	// Notified by the release: well before the writer's TTL would end.
	release(t, ctx, locktest.Granted(t, reader, 5*time.Second))

	// A reader that dies: the writer gets the key when its hold expires.
	dead, err := newC().RWLock(k).RLock(ctx, dlock.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	wl, err = newC().RWLock(k).Lock(ctx)
	if err != nil {
		t.Fatalf("writer after a dead reader: %v", err)
	}
	if time.Now().Before(dead.Expires()) {
		t.Fatalf("writer granted before the dead reader's Expires")
	}
	if wl.Fence() <= dead.Fence() {
		t.Fatalf("writer's fence %d, want above the dead reader's %d", wl.Fence(), dead.Fence())
	}
	release(t, ctx, wl)
}

// TestKindInspectForceRelease: Inspect lists a semaphore's permits;
// ForceRelease removes them, and their holders' refreshes then fail with
// ErrNotHeld; the semaphore's number of permits may change once nobody
// holds it.
func TestKindInspectForceRelease(t *testing.T) {
	rdb, b, ctx := onSrv(t)
	k := key(t)
	var rs []dlock.Request
	for i := 0; i < 3; i++ {
		rs = append(rs, holding(t, b, kindReq(k, "p"+strconv.Itoa(i), dlock.KindPermit, 3, time.Minute)))
	}
	if g, err := b.TryAcquire(ctx, kindReq(k, "p4", dlock.KindPermit, 3, time.Minute)); err != nil || g.OK || g.HolderTTL <= 0 {
		t.Fatalf("a fourth permit of 3: got %+v, %v; want not granted, with the first holder's TTL", g, err)
	}
	info, err := b.Inspect(ctx, k)
	if err != nil || !info.Held || info.Kind != dlock.KindPermit || info.Permits != 3 || len(info.Holds) != 3 {
		t.Fatalf("Inspect: got %+v, %v; want 3 permits of 3", info, err)
	}
	for _, h := range info.Holds {
		if h.TTL <= 0 || h.TTL > time.Minute || !strings.HasPrefix(h.Owner, "p") {
			t.Fatalf("Inspect: hold %+v, want an owner p* and a TTL within a minute", h)
		}
	}
	forced, err := b.ForceRelease(ctx, k)
	if err != nil || forced.Kind != dlock.KindPermit || len(forced.Holds) != 3 {
		t.Fatalf("ForceRelease: got %+v, %v; want the 3 permits", forced, err)
	}
	for _, r := range rs {
		if err := b.Refresh(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Refresh after ForceRelease: got %v, want ErrNotHeld", err)
		}
	}
	if n := rdb.Exists(ctx, b.LockName(k), b.LockName(k)+":h").Val(); n != 0 {
		t.Fatalf("keys after ForceRelease: got %d, want 0", n)
	}
	mustRelease(t, b, holding(t, b, kindReq(k, "again", dlock.KindPermit, 5, time.Minute)))
}

// TestKindMarkerDeleted: when a key's marker is deleted behind its
// holders' backs (an eviction, a stray DEL), the next hold starts afresh:
// the earlier holds are void (their refresh and release fail with
// ErrNotHeld) and do not count against the permits; a writer's claim
// left from an earlier marker does not keep new readers out.
func TestKindMarkerDeleted(t *testing.T) {
	rdb, b, ctx := onSrv(t)
	for _, k := range []dlock.Kind{dlock.KindPermit, dlock.KindRead} {
		key := key(t) + k.String()
		old := holding(t, b, kindReq(key, "old", k, 1, time.Minute))
		if err := rdb.Del(ctx, b.LockName(key)).Err(); err != nil {
			t.Fatal(err)
		}
		r := holding(t, b, kindReq(key, "new", k, 1, time.Minute))
		if r.Fence <= old.Fence {
			t.Fatalf("%s: fence after the DEL: got %d, want above %d", k, r.Fence, old.Fence)
		}
		if err := b.Refresh(ctx, old); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("%s: Refresh of a hold whose marker was deleted: got %v, want ErrNotHeld", k, err)
		}
		if err := b.Release(ctx, old); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("%s: Release of a hold whose marker was deleted: got %v, want ErrNotHeld", k, err)
		}
		info, err := b.Inspect(ctx, key)
		if err != nil || len(info.Holds) != 1 || info.Holds[0].Owner != "new" {
			t.Fatalf("%s: Inspect: got %+v, %v; want the new hold only", k, info, err)
		}
		mustRelease(t, b, r)
	}

	// A claim left in the claims' set by a writer of an earlier marker.
	key := key(t) + "claim"
	claims := b.LockName(key) + ":x"
	staleClaim := func() {
		t.Helper()
		if err := rdb.ZAdd(ctx, claims, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: "gone"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	first := holding(t, b, kindReq(key, "r1", dlock.KindRead, 0, time.Minute))
	staleClaim()
	mustRelease(t, b, first)
	staleClaim()
	rdb.Expire(ctx, claims, time.Hour)
	r1 := holding(t, b, kindReq(key, "r1", dlock.KindRead, 0, time.Minute))
	w := req(key, time.Minute)
	w.Waiting = true
	if g, err := b.TryAcquire(ctx, w); err != nil || g.OK {
		t.Fatalf("a writer behind a reader: got %+v, %v; want not granted", g, err)
	}
	if err := b.Release(ctx, dlock.Request{Key: key, Token: w.Token, TTL: w.TTL, Waiting: true}); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("the writer's withdrawal: got %v, want ErrNotHeld", err)
	}
	r2 := holding(t, b, kindReq(key, "r2", dlock.KindRead, 0, time.Minute)) // the stale claim keeps no one out
	mustRelease(t, b, r1, r2)
}

// TestKindPermitQueue: permit waiters queue in the semaphore's queue (with
// or without WithFIFO) and get the permits released in arrival order, one
// hand-off per release; a waiter that gives up leaves the queue and a
// permit handed to it goes on to the next.
func TestKindPermitQueue(t *testing.T) {
	rdb := newRDB(t, srv.Addr())
	insp := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	holder, err := newClient(t, rdb).Semaphore(k, 1).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	type result struct {
		i int
		l *dlock.Lease
	}
	got := make(chan result, n)
	gone, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := 0; i < n; i++ {
		wctx, opts := ctx, []dlock.Option{}
		if i%2 == 1 {
			opts = append(opts, dlock.WithFIFO())
		}
		if i == 1 {
			wctx = gone // gives up while queued
		}
		c := newClient(t, rdb)
		go func() {
			l, err := c.Semaphore(k, 1).Acquire(wctx, opts...)
			if err != nil {
				if i != 1 || !errors.Is(err, context.Canceled) {
					t.Errorf("waiter %d: %v", i, err)
				}
				l = nil
			}
			got <- result{i, l}
		}()
		waitFor(t, 5*time.Second, "the waiter to queue", func() bool {
			info, err := insp.Inspect(ctx, k)
			return err == nil && info.Waiters == i+1
		})
	}
	cancel()
	if r := <-got; r.i != 1 || r.l != nil {
		t.Fatalf("first result: waiter %d, want the one that gave up", r.i)
	}
	release(t, ctx, holder)
	last := holder.Fence()
	for _, want := range []int{0, 2, 3} {
		select {
		case r := <-got:
			if r.i != want || r.l == nil {
				t.Fatalf("served waiter %d, want %d (arrival order)", r.i, want)
			}
			if r.l.Fence() <= last {
				t.Fatalf("waiter %d: fence %d, want above %d", r.i, r.l.Fence(), last)
			}
			last = r.l.Fence()
			release(t, ctx, r.l)
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not served", want)
		}
	}
	waitFor(t, 2*redislock.DefaultWaiterTTL+5*time.Second, "the semaphore's keys to go", func() bool {
		lock := insp.LockName(k)
		return rdb.Exists(ctx, lock, lock+":h", lock+":pq").Val() == 0
	})
}

// TestKindLeaderValue: a campaign's value is stored with its grant and
// reported by Inspect while that grant holds the lock; renewals keep it
// as long as the lock; SetValue of another grant changes nothing.
func TestKindLeaderValue(t *testing.T) {
	rdb, b, ctx := onSrv(t)
	k := key(t)
	r := holding(t, b, dlock.Request{Key: k, Token: "leader", TTL: 300 * time.Millisecond, Value: "v1"})
	if info, err := b.Inspect(ctx, k); err != nil || info.Value != "v1" || info.Fence != r.Fence {
		t.Fatalf("Inspect: got %+v, %v; want value v1", info, err)
	}
	stale := r
	stale.Fence--
	stale.Value = "stale"
	if err := b.SetValue(ctx, stale); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("SetValue of another grant: got %v, want ErrNotHeld", err)
	}
	// Renewed past the first TTL, the value stays: a renewal to 2s, and
	// another once the lock's TTL on the server shows that the first
	// 300ms have passed.
	r.TTL = 2 * time.Second
	for i := 0; i < 2; i++ {
		if err := b.Refresh(ctx, r); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			waitFor(t, 5*time.Second, "the first TTL to pass on the server", func() bool {
				return rdb.PTTL(ctx, b.LockName(k)).Val() < r.TTL-300*time.Millisecond
			})
		}
	}
	if info, err := b.Inspect(ctx, k); err != nil || info.Value != "v1" {
		t.Fatalf("Inspect after renewals: got %+v, %v; want value v1", info, err)
	}
	if pv, pl := rdb.PTTL(ctx, b.LockName(k)+":v").Val(), rdb.PTTL(ctx, b.LockName(k)).Val(); pv < pl-50*time.Millisecond {
		t.Fatalf("value's PTTL %v, want the lock's %v", pv, pl)
	}
	mustRelease(t, b, r)
	if info, err := b.Inspect(ctx, k); err != nil || info.Held || info.Value != "" {
		t.Fatalf("Inspect after the release: got %+v, %v; want no holder", info, err)
	}
}

// TestKindWriterClaim: a writer's attempt that will be retried
// (Request.Waiting) keeps new readers out of a key readers hold, until it
// withdraws (a Release with Waiting and no fence, which wakes the readers
// it kept out) or its TTL passes; readers that hold go on.
func TestKindWriterClaim(t *testing.T) {
	_, b, ctx := onSrv(t)
	k := key(t)
	r1 := holding(t, b, kindReq(k, "r1", dlock.KindRead, 0, time.Minute))
	w := dlock.Request{Key: k, Token: "w", TTL: 300 * time.Millisecond, Waiting: true}
	if g, err := b.TryAcquire(ctx, w); err != nil || g.OK {
		t.Fatalf("writer behind a reader: got %+v, %v; want not granted", g, err)
	}
	r2 := kindReq(k, "r2", dlock.KindRead, 0, time.Minute)
	if g, err := b.TryAcquire(ctx, r2); err != nil || g.OK {
		t.Fatalf("reader behind a waiting writer: got %+v, %v; want not granted", g, err)
	}
	if err := b.Refresh(ctx, r1); err != nil {
		t.Fatalf("the holding reader's refresh: %v", err)
	}
	ch, stop, err := b.Watch(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := b.Release(ctx, w); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("withdrawal: got %v, want ErrNotHeld", err)
	}
	notified(t, ch, "withdrawal: the release message for the readers kept out")
	g, err := b.TryAcquire(ctx, r2)
	if err != nil || !g.OK {
		t.Fatalf("reader after the withdrawal: got %+v, %v; want granted", g, err)
	}

	// A claim that is not withdrawn ends with its TTL.
	if g, err := b.TryAcquire(ctx, w); err != nil || g.OK {
		t.Fatalf("writer behind readers: got %+v, %v; want not granted", g, err)
	}
	r3 := kindReq(k, "r3", dlock.KindRead, 0, time.Minute)
	waitFor(t, 5*time.Second, "the claim to end with its TTL", func() bool {
		g, err := b.TryAcquire(ctx, r3)
		return err == nil && g.OK
	})
}

// TestKindQueuedWriterLeaves: a writer queued behind readers that gives
// up wakes the readers it kept out (the release message), as a
// withdrawn claim does.
func TestKindQueuedWriterLeaves(t *testing.T) {
	_, b, ctx := onSrv(t)
	k := key(t)
	r1 := holding(t, b, kindReq(k, "r1", dlock.KindRead, 0, time.Minute))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	writer := make(chan error, 1)
	go func() {
		_, err := b.Wait(wctx, dlock.Request{Key: k, Token: "w", TTL: time.Minute})
		writer <- err
	}()
	waitFor(t, 5*time.Second, "the writer to queue", func() bool {
		info, err := b.Inspect(ctx, k)
		return err == nil && info.Waiters == 1
	})
	r2 := kindReq(k, "r2", dlock.KindRead, 0, time.Minute)
	if g, err := b.TryAcquire(ctx, r2); err != nil || g.OK {
		t.Fatalf("reader behind a queued writer: got %+v, %v; want not granted", g, err)
	}
	ch, stop, err := b.Watch(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cancel()
	if err := <-writer; !errors.Is(err, context.Canceled) {
		t.Fatalf("the writer's Wait: got %v, want context.Canceled", err)
	}
	notified(t, ch, "the queued writer left: the release message for the readers kept out")
	g, err := b.TryAcquire(ctx, r2)
	if err != nil || !g.OK {
		t.Fatalf("reader after the writer left: got %+v, %v; want granted", g, err)
	}
	r2.Fence = g.Fence
	mustRelease(t, b, r1, r2)
}

// TestKindWriterClaimForgotten: a writer granted after it claimed the key
// (readers left) leaves no record of its claim behind in the Backend: one
// per contended write would grow for the Backend's lifetime.
func TestKindWriterClaimForgotten(t *testing.T) {
	_, b, ctx := onSrv(t)
	k := key(t)
	for i := range 5 {
		r := holding(t, b, kindReq(k, fmt.Sprint("r", i), dlock.KindRead, 0, time.Minute))
		w := dlock.Request{Key: k, Token: fmt.Sprint("w", i), TTL: time.Minute, Waiting: true}
		if g, err := b.TryAcquire(ctx, w); err != nil || g.OK {
			t.Fatalf("writer behind a reader: got %+v, %v; want not granted", g, err)
		}
		if err := b.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
		tryRelease(t, ctx, b, w) // the writer, after the reader left
	}
	if n := redislock.WriterClaims(b); n != 0 {
		t.Fatalf("writers' claim records after every writer was granted: %d, want 0", n)
	}
}

// TestKindBadInput: a read hold on a semaphore's key is refused with
// ErrWrongType, a lock request on it is not granted, a waiter that
// disagrees on the number of permits gets ErrPermits, a permit or read hold
// past its deadline can be neither refreshed nor released, and a permit
// released as a read hold changes nothing.
func TestKindBadInput(t *testing.T) {
	rdb, b, ctx := onSrv(t)
	k := key(t)
	p := holding(t, b, kindReq(k, "p", dlock.KindPermit, 2, time.Minute))
	if _, err := b.TryAcquire(ctx, kindReq(k, "r", dlock.KindRead, 0, time.Minute)); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("a read hold on a semaphore's key: got %v, want ErrWrongType", err)
	}
	if g, err := b.TryAcquire(ctx, req(k, time.Minute)); err != nil || g.OK {
		t.Fatalf("a lock on a semaphore's key: got %+v, %v; want not granted", g, err)
	}
	disagree := kindReq(k, "d", dlock.KindPermit, 3, time.Minute)
	if _, err := b.Wait(ctx, disagree); !errors.Is(err, dlock.ErrPermits) {
		t.Fatalf("a queued permit waiter that says 3 permits where the holder says 2: got %v, want ErrPermits", err)
	}
	asRead := p
	asRead.Kind = dlock.KindRead
	if err := b.Release(ctx, asRead); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("a permit released as a read hold: got %v, want ErrNotHeld", err)
	}
	if err := b.Refresh(ctx, p); err != nil {
		t.Fatalf("the permit after the bad release: %v", err)
	}
	mustRelease(t, b, p)

	short := holding(t, b, kindReq(key(t), "s", dlock.KindPermit, 2, 50*time.Millisecond))
	other := holding(t, b, kindReq(short.Key, "o", dlock.KindPermit, 2, time.Minute))
	// The holds' scores are their deadlines in server ms (kind_lib.lua).
	waitFor(t, 5*time.Second, "the short permit's deadline to pass on the server", func() bool {
		now := rdb.Time(ctx).Val().UnixMilli()
		return rdb.ZCount(ctx, b.LockName(short.Key)+":h", "-inf", strconv.FormatInt(now, 10)).Val() == 1
	})
	if err := b.Refresh(ctx, short); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh past the deadline: got %v, want ErrNotHeld", err)
	}
	if err := b.Release(ctx, short); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release past the deadline: got %v, want ErrNotHeld", err)
	}
	if info, err := b.Inspect(ctx, short.Key); err != nil || len(info.Holds) != 1 || info.Holds[0].Owner != "o" {
		t.Fatalf("Inspect: got %+v, %v; want the live permit only", info, err)
	}
	mustRelease(t, b, other)
}

// TestKindPermitContention: 8 Clients take 40 permits each from a
// semaphore of 2 (held about 100 µs); never more than 2 at once. It logs
// the server commands per permit: a release hands the permit to one
// queued waiter, so waiters do not all try again.
func TestKindPermitContention(t *testing.T) {
	if testing.Short() {
		t.Skip("contention run")
	}
	rdb := newRDB(t, srv.Addr())
	ctx := ctxT(t, time.Minute)
	k := key(t)
	const clients, rounds, permits = 8, 40, 2
	var peak locktest.Peak
	before := cmdCalls(t, rdb)
	sems := make([]*dlock.Semaphore, clients)
	for i := range sems {
		sems[i] = newClient(t, rdb).Semaphore(k, permits)
	}
	err := locktest.Workers(clients, rounds, func(w, _ int) error {
		l, err := sems[w].Acquire(ctx)
		if err != nil {
			return err
		}
		peak.Enter()
		// Hold ≈100µs, the point: the holds must overlap for the bound to
		// be tested.
		locktest.Hold(100 * time.Microsecond)
		peak.Leave()
		return l.Release(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	n := float64(clients * rounds)
	t.Logf("%d permits: %.1f server commands per permit (load %s)",
		clients*rounds, float64(cmdCalls(t, rdb)-before)/n, scale.LoadAvg())
	if m := peak.Most(); m > permits {
		t.Fatalf("permits held at once: got %d, want at most %d", m, permits)
	}
}
