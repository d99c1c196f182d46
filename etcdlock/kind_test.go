package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// kv returns the number of KV requests (Range, Txn, Put, DeleteRange) in
// the counts m.
func kv(m map[string]int) int { return m["Range"] + m["Txn"] + m["Put"] + m["DeleteRange"] }

// settled returns the KV requests each of counters has sent, once none
// sent one for 200ms: a waiter sends none once it watches.
func settled(t *testing.T, counters []*rpcCounter) []int {
	t.Helper()
	return locktest.Settle(t, 30*time.Second, 200*time.Millisecond, func() []int {
		n := make([]int, len(counters))
		for i, rc := range counters {
			n[i] = kv(rc.snapshot())
		}
		return n
	}, slices.Equal[[]int])
}

func describe(m map[string]int, ops int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(m[k])/float64(ops)))
	}
	return strings.Join(parts, ", ")
}

func diff(after, before map[string]int) map[string]int {
	d := make(map[string]int)
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// TestKindRequests measures the etcd requests of an uncontended
// acquire + release of a permit and of a read hold: one transaction each
// (the grant, the release), plus a lease keep-alive about every TTL/10.
func TestKindRequests(t *testing.T) {
	const ops = 200
	for _, kind := range []string{"permit", "read", "lock"} {
		t.Run(kind, func(t *testing.T) {
			rc, c, _ := newCountedClient(t)
			key := dlocktest.Key(t)
			ctx := locktest.Ctx(t, time.Minute)
			acquire := func() (*dlock.Lease, error) {
				switch kind {
				case "permit":
					return c.Semaphore(key, 3).Acquire(ctx)
				case "read":
					return c.RWLock(key).RLock(ctx)
				}
				return c.Acquire(ctx, key)
			}
			cycle := func() {
				l, err := acquire()
				if err != nil {
					t.Fatalf("acquire: %v", err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatalf("release: %v", err)
				}
			}
			cycle() // the lease grant
			before := rc.snapshot()
			start := time.Now()
			for range ops {
				cycle()
			}
			took := time.Since(start)
			d := diff(rc.snapshot(), before)
			t.Logf("%s acquire+release: %.2f KV requests, %.2f requests in all per op (%s), %v per op",
				kind, float64(kv(d))/ops, float64(sum(d))/ops, describe(d, ops), (took / ops).Round(time.Microsecond))
			if got := kv(d); got > 2*ops {
				t.Errorf("KV requests for %d acquire+release: got %d, want at most %d", ops, got, 2*ops)
			}
		})
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// queued waits until key has n entries (holders and waiters). A permit
// waiter must queue with WithFIFO for the count to mean it queued: the
// Client would otherwise try first, and a permit's failed try creates
// and deletes an entry.
func queued(t testing.TB, cli *clientv3.Client, key string, n int64) {
	t.Helper()
	locktest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d entries under %s", n, key), func() bool { return entries(t, cli, key) == n })
}

type result struct {
	i   int
	l   *dlock.Lease
	err error
}

// TestPermitQueue: waiters for a full semaphore are served in arrival
// order, and a released permit wakes only the waiters whose view it
// changes: with 2 permits, the release of the first holder wakes the
// first waiter alone (the later ones watch other entries and send
// nothing). Nothing is left behind.
func TestPermitQueue(t *testing.T) {
	const n, waiters = 2, 5
	key := dlocktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	cli := newCli(t, srv.Endpoints())
	hc, _ := newClient(t, srv.Endpoints())
	holders := locktest.MustPermits(t, ctx, hc.Semaphore(key, n), n)
	got := make(chan result, waiters)
	counters := make([]*rpcCounter, waiters)
	for i := range waiters {
		rc, c, _ := newCountedClient(t)
		counters[i] = rc
		go func() {
			l, err := c.Semaphore(key, n).Acquire(ctx, dlock.WithFIFO()) // straight to the queue: no try first
			got <- result{i, l, err}
		}()
		queued(t, cli, key, int64(n+i+1))
	}
	before := settled(t, counters)
	if err := holders[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if first.err != nil || first.i != 0 {
		t.Fatalf("after the first release: waiter %d granted (%v), want waiter 0", first.i, first.err)
	}
	if first.l.Fence() <= holders[1].Fence() {
		t.Errorf("fence of the first waiter: got %d, want above the holders' (%d)", first.l.Fence(), holders[1].Fence())
	}
	after := settled(t, counters)
	for i := 1; i < waiters; i++ {
		if d := after[i] - before[i]; d != 0 {
			t.Errorf("waiter %d sent %d KV requests after a release that does not concern it, want 0", i, d)
		}
	}
	// The others in arrival order, each after one release.
	prev := first
	for i := 1; i < waiters; i++ {
		if err := prev.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil || r.i != i {
			t.Fatalf("grant %d: waiter %d (%v), want waiter %d", i, r.i, r.err, i)
		}
		prev = r
	}
	prev.l.Release(ctx)
	holders[1].Release(ctx)
	if e := entries(t, cli, key); e != 0 {
		t.Errorf("entries left after every release: got %d, want 0", e)
	}
}

// TestReadWriteQueue: a queued writer keeps later readers out; it gets
// the key when the readers ahead leave, with a fence above theirs; the
// readers behind it share the key after it, and the release of a reader
// ahead of the writer sends nothing on their behalf (they watch the
// writer). Nothing is left behind.
func TestReadWriteQueue(t *testing.T) {
	key := dlocktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	cli := newCli(t, srv.Endpoints())
	rc1, _ := newClient(t, srv.Endpoints())
	r1, err := rc1.RWLock(key).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wc, _ := newClient(t, srv.Endpoints())
	wgot := make(chan result, 1)
	go func() {
		l, err := wc.RWLock(key).Lock(ctx)
		wgot <- result{0, l, err}
	}()
	queued(t, cli, key, 2)
	rgot := make(chan result, 2)
	var counters []*rpcCounter
	for i := range 2 {
		rc, c, _ := newCountedClient(t)
		counters = append(counters, rc)
		go func() {
			l, err := c.RWLock(key).RLock(ctx)
			rgot <- result{i, l, err}
		}()
		queued(t, cli, key, int64(3+i))
	}
	before := settled(t, counters) // the readers watch the writer by now
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-wgot
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	if w.l.Fence() <= r1.Fence() {
		t.Errorf("writer's fence %d, want above the reader's %d", w.l.Fence(), r1.Fence())
	}
	select {
	case r := <-rgot:
		t.Fatalf("reader %d granted while the writer holds (%v)", r.i, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	for i, rc := range counters {
		if d := kv(rc.snapshot()) - before[i]; d != 0 {
			t.Errorf("reader %d behind the writer sent %d KV requests when the reader ahead left, want 0", i, d)
		}
	}
	if err := w.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var readers []*dlock.Lease
	for range 2 {
		r := <-rgot
		if r.err != nil {
			t.Fatalf("reader %d: %v", r.i, r.err)
		}
		if r.l.Fence() <= w.l.Fence() {
			t.Errorf("reader %d fence %d, want above the writer's %d", r.i, r.l.Fence(), w.l.Fence())
		}
		readers = append(readers, r.l)
	}
	for _, l := range readers {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if e := entries(t, cli, key); e != 0 {
		t.Errorf("entries left after every release: got %d, want 0", e)
	}
}

// TestKindInspect: Inspect lists the holders of a semaphore (not its
// waiters) with their fences and TTLs; ForceRelease removes them all and
// their Clients learn it.
func TestKindInspect(t *testing.T) {
	key := dlocktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	c, b := newClient(t, srv.Endpoints())
	held := locktest.MustPermits(t, ctx, c.Semaphore(key, 2), 2)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wc, _ := newClient(t, srv.Endpoints())
	done := make(chan error, 1)
	go func() {
		l, err := wc.Semaphore(key, 2).Acquire(wctx, dlock.WithFIFO())
		if err == nil {
			l.Release(ctx)
		}
		done <- err
	}()
	queued(t, newCli(t, srv.Endpoints()), key, 3)
	info, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Kind != dlock.KindPermit || info.Permits != 2 || len(info.Holds) != 2 || info.Waiters != 1 {
		t.Fatalf("Inspect: got %+v, want 2 permits held of 2, 1 waiter", info)
	}
	for _, h := range info.Holds {
		if h.TTL <= 0 || h.TTL > ttl+time.Second {
			t.Errorf("hold %s: TTL %v, want in (0, %v]", h.Owner, h.TTL, ttl+time.Second)
		}
		found := false
		for _, l := range held {
			found = found || (l.Owner() == h.Owner && l.Fence() == h.Fence)
		}
		if !found {
			t.Errorf("hold %+v is not one of the holders", h)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: got %v, want context.Canceled", err)
	}
	if _, err := b.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	for _, l := range held {
		select {
		case <-l.Done():
		case <-time.After(ttl):
			t.Fatal("force-released permit: Done not closed")
		}
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Held {
		t.Fatalf("Inspect after ForceRelease: got %+v, %v; want nothing held", info, err)
	}
}

// TestKindMismatch: a request of another kind than the hold it names
// (through the Backend that granted it) changes nothing.
func TestKindMismatch(t *testing.T) {
	key := dlocktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	c, b := newClient(t, srv.Endpoints())
	r, err := c.RWLock(key).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release(ctx)
	req := dlock.Request{Key: key, Token: r.Owner(), TTL: ttl, Fence: r.Fence()}
	if err := b.Release(ctx, req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("a read hold released as a lock: got %v, want ErrNotHeld", err)
	}
	if err := b.Refresh(ctx, req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("a read hold refreshed as a lock: got %v, want ErrNotHeld", err)
	}
	req.Kind, req.Permits = dlock.KindPermit, 1
	if err := b.Release(ctx, req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("a read hold released as a permit: got %v, want ErrNotHeld", err)
	}
	if err := b.SetValue(ctx, dlock.Request{Key: key, Token: r.Owner(), TTL: ttl, Fence: r.Fence(), Value: "x"}); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("SetValue on a read hold: got %v, want ErrNotHeld", err)
	}
	if r.Err() != nil {
		t.Fatalf("read hold after the mismatched requests: %v", r.Err())
	}
	if _, err := c.RWLock(key).TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock: got %v, want ErrNotAcquired (the read hold is still held)", err)
	}
	if _, err := c.RWLock(key).TryRLock(ctx); err != nil {
		t.Fatalf("a second reader: %v", err)
	}
}

// TestElectionValue: the leader's value survives the move of its entry to
// a longer lease (a Refresh with a longer TTL) and is replaced by
// Proclaim; the term is the entry's fence.
func TestElectionValue(t *testing.T) {
	key := dlocktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	c, _ := newClient(t, srv.Endpoints())
	e := c.Election(key)
	l, err := e.Campaign(ctx, "v 1") // a space in the value
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, 3*ttl); err != nil {
		t.Fatal(err)
	}
	watcher, _ := newClient(t, srv.Endpoints())
	cur, err := watcher.Election(key).Leader(ctx)
	if err != nil || cur.Value != "v 1" || cur.Term != l.Fence() || cur.Owner != l.Owner() {
		t.Fatalf("Leader after a longer Refresh: got %+v, %v; want value %q, term %d", cur, err, "v 1", l.Fence())
	}
	if err := e.Proclaim(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if cur, err = watcher.Election(key).Leader(ctx); err != nil || cur.Value != "w" || cur.Term != l.Fence() {
		t.Fatalf("Leader after Proclaim: got %+v, %v; want value w, term %d", cur, err, l.Fence())
	}
	if err := l.Refresh(ctx, ttl); err != nil {
		t.Fatalf("Refresh after Proclaim: %v", err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := watcher.Election(key).Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader after Resign: got %v, want ErrNoLeader", err)
	}
}

// TestKindDeadHolder: a permit or read hold held by a process killed
// with SIGKILL returns when its lease expires, within the TTL (plus
// etcd's expiry check) of the kill: a permit waiter, or a writer waiting
// behind the dead reader, gets the key.
func TestKindDeadHolder(t *testing.T) {
	t.Run("permit", func(t *testing.T) { killHolder(t, dlock.KindPermit, dlock.WithFIFO()) })
	t.Run("read", func(t *testing.T) { killHolder(t, dlock.KindRead) })
}

// TestKindRequestsContended measures the etcd requests per acquire +
// release under contention: 4 Clients taking permits of a semaphore of 2,
// and 3 readers with 1 writer on a read-write lock, each in a loop.
func TestKindRequestsContended(t *testing.T) {
	const clients, rounds = 4, 40
	for _, kind := range []string{"permit", "rw"} {
		t.Run(kind, func(t *testing.T) {
			key := dlocktest.Key(t)
			ctx := locktest.Ctx(t, 2*time.Minute)
			var (
				cs       []*dlock.Client
				counters []*rpcCounter
			)
			for range clients {
				rc, c, _ := newCountedClient(t)
				cs, counters = append(cs, c), append(counters, rc)
			}
			var wg sync.WaitGroup
			start := time.Now()
			for i, c := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range rounds {
						var (
							l   *dlock.Lease
							err error
						)
						switch {
						case kind == "permit":
							l, err = c.Semaphore(key, 2).Acquire(ctx)
						case i == 0:
							l, err = c.RWLock(key).Lock(ctx)
						default:
							l, err = c.RWLock(key).RLock(ctx)
						}
						if err != nil {
							t.Errorf("acquire: %v", err)
							return
						}
						locktest.Work(l, time.Millisecond)
						if err := l.Release(ctx); err != nil {
							t.Errorf("release: %v", err)
							return
						}
					}
				}()
			}
			wg.Wait()
			took := time.Since(start)
			total := make(map[string]int)
			for _, rc := range counters {
				for k, v := range rc.snapshot() {
					total[k] += v
				}
			}
			const ops = clients * rounds
			t.Logf("%s, %d Clients: %.2f KV requests, %.2f requests in all per acquire+release (%s), %v per op",
				kind, clients, float64(kv(total))/ops, float64(sum(total))/ops, describe(total, ops), (took / ops).Round(time.Microsecond))
			if e := entries(t, newCli(t, srv.Endpoints()), key); e != 0 {
				t.Errorf("entries left after every release: got %d, want 0", e)
			}
		})
	}
}

// TestEntryValue: an entry's value keeps the hold count, the token and a
// leader's value apart whatever they contain; anything else is refused.
func TestEntryValue(t *testing.T) {
	for _, c := range []struct {
		count        int
		token, value string
	}{
		{1, "TOKEN", ""}, {3, "owner with spaces/and slash", ""}, {1, "T", "v 1"},
		{1, "a b", " leading space"}, {2, "9/9 x", "9/9 y"}, {1, "", "v"},
	} {
		enc := etcdlock.EncodeEntry(c.count, c.token, c.value)
		n, token, value, ok := etcdlock.DecodeEntry([]byte(enc))
		if !ok || n != c.count || token != c.token || value != c.value {
			t.Errorf("DecodeEntry(%q): got %d %q %q %v, want %d %q %q true", enc, n, token, value, ok, c.count, c.token, c.value)
		}
	}
	for _, bad := range []string{"", "x", " T", "0 T", "1/9 short", "1/-1 T", "a/1 T", "1/ T"} {
		if _, _, _, ok := etcdlock.DecodeEntry([]byte(bad)); ok {
			t.Errorf("DecodeEntry(%q): ok, want refused", bad)
		}
	}
}
