package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/scale"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

func TestNewInvalid(t *testing.T) {
	rdbs := newClients(t)
	same := redis.NewClient(&redis.Options{Addr: nodes[0].Addr()})
	t.Cleanup(func() { same.Close() })
	cases := []struct {
		name string
		b    *redlock.Backend
	}{
		{"None", redlock.NewWithOptions([]*redis.Client{})},
		{"One", redlock.New(rdbs[0])},
		{"Two", redlock.New(rdbs[:2]...)},
		{"Four", redlock.New(rdbs[:4]...)},
		{"NilNode", redlock.New(rdbs[0], nil, rdbs[2])},
		{"SameClientTwice", redlock.New(rdbs[0], rdbs[1], rdbs[0])},
		{"SameAddressTwice", redlock.New(rdbs[0], rdbs[1], same)},
		{"NilOption", redlock.NewWithOptions(rdbs[:3], nil)},
		{"ZeroNodeTimeout", redlock.NewWithOptions(rdbs[:3], redlock.WithNodeTimeout(0))},
		{"NegativeSubscribeTimeout", redlock.NewWithOptions(rdbs[:3], redlock.WithSubscribeTimeout(-time.Second))},
		{"BracePrefix", redlock.NewWithOptions(rdbs[:3], redlock.WithPrefix("a{b"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.b.Err()
			if !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("Err: got %v, want ErrInvalidOption", err)
			}
			if !strings.HasPrefix(err.Error(), "redlock: ") {
				t.Fatalf("Err %q does not start with \"redlock: \"", err)
			}
			_, err = tc.b.TryAcquire(context.Background(), req("k", time.Second))
			if !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("TryAcquire: got %v, want ErrInvalidOption", err)
			}
			if err := tc.b.Close(); err != nil {
				t.Fatalf("Close: got %v, want nil", err)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	b := newBackend(t)
	ctx := locktest.Ctx(t, 10*time.Second)
	short := req("k", redlock.MinTTL-time.Millisecond)
	if _, err := b.TryAcquire(ctx, short); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("TryAcquire with TTL %v: got %v, want ErrInvalidTTL", short.TTL, err)
	}
	if err := b.Refresh(ctx, short); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Errorf("Refresh with TTL %v: got %v, want ErrInvalidTTL", short.TTL, err)
	}
	if _, err := b.TryAcquire(ctx, dlock.Request{Key: "k", TTL: time.Second}); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Errorf("TryAcquire with no token: got %v, want ErrInvalidOption", err)
	}
	if _, err := b.TryAcquire(ctx, req("", time.Second)); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Errorf("TryAcquire with no key: got %v, want ErrInvalidKey", err)
	}
	//lint:ignore SA1012 testing nil context handling
	if _, err := b.Inspect(nil, "k"); !errors.Is(err, dlock.ErrInvalidOption) { //nolint:staticcheck
		t.Errorf("Inspect with a nil context: got %v, want ErrInvalidOption", err)
	}
	if got := b.Quorum(); got != 3 {
		t.Errorf("Quorum: got %d, want 3", got)
	}
	if got := b.Nodes(); len(got) != 5 || got[0] != nodes[0].Addr() {
		t.Errorf("Nodes: got %v, want the 5 addresses in order", got)
	}
}

func TestClosed(t *testing.T) {
	b := redlock.New(newClients(t)...)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: got %v, want nil", err)
	}
	if _, err := b.TryAcquire(context.Background(), req("k", time.Second)); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryAcquire after Close: got %v, want ErrClosed", err)
	}
	if _, _, err := b.Subscribe(context.Background(), "k"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Subscribe after Close: got %v, want ErrClosed", err)
	}
}

// acquire takes key on b with a fresh token, failing the test otherwise,
// and returns the request to refresh or release it with.
func acquire(t *testing.T, b *redlock.Backend, key string, ttl time.Duration) dlock.Request {
	t.Helper()
	r := req(key, ttl)
	g, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), r)
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire(%q): got %+v, %v, want a grant", key, g, err)
	}
	r.Fence = g.Fence
	return r
}

// acquireEverywhere takes a fresh key on b until every node of nbs holds
// it: a grant on a quorum is enough for a lease, and a node that answered
// after the others is given back, which a loaded machine makes likely.
func acquireEverywhere(t *testing.T, b *redlock.Backend, nbs []*redislock.Backend, ttl time.Duration) dlock.Request {
	t.Helper()
	ctx := locktest.Ctx(t, 30*time.Second)
	for ctx.Err() == nil {
		r := acquire(t, b, locktest.Key(t), ttl)
		held := 0
		for _, nb := range nbs {
			if info, err := nb.Inspect(ctx, r.Key); err == nil && info.Held {
				held++
			}
		}
		if held == len(nbs) {
			return r
		}
		if err := b.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("no grant held on all %d nodes within 30s", len(nbs))
	return dlock.Request{}
}

// nodeBackends returns a redislock.Backend on each node, to look at or
// plant locks node by node.
func nodeBackends(t *testing.T) []*redislock.Backend {
	t.Helper()
	var out []*redislock.Backend
	for _, rdb := range newClients(t) {
		nb := redislock.New(rdb)
		t.Cleanup(func() { nb.Close() })
		out = append(out, nb)
	}
	return out
}

// plant takes key for token directly on the given nodes.
func plant(t *testing.T, key, token string, ttl time.Duration, idx ...int) {
	t.Helper()
	nbs := nodeBackends(t)
	for _, i := range idx {
		g, err := nbs[i].TryAcquire(locktest.Ctx(t, 10*time.Second), dlock.Request{Key: key, Token: token, TTL: ttl})
		if err != nil || !g.OK {
			t.Fatalf("plant on node %d: got %+v, %v", i, g, err)
		}
	}
}

// TestWriteBack checks that after an acquisition every node holds the
// lock for the lease's token with the lease's fence (the maximum of the
// nodes' fences), and that after the release every such node keeps a
// tombstone at that fence while it runs ahead of the node's clock.
func TestWriteBack(t *testing.T) {
	// Every node must answer (node 3 holds the maximum): a node timeout a
	// loaded machine does not reach.
	b := newBackend(t, redlock.WithNodeTimeout(time.Second))
	k := locktest.Key(t)
	// Node 3's fences run far ahead (as if its clock did): the fence must
	// come from it.
	ahead := uint64(time.Now().UnixMicro()) + 1e9
	rdbs := newClients(t)
	lock := redislock.New(rdbs[0]).LockName(k)
	if err := rdbs[3].Set(context.Background(), lock, tombstone(ahead), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := acquire(t, b, k, 5*time.Second)
	if r.Fence != ahead+1 {
		t.Fatalf("fence: got %d, want %d (the maximum over the nodes)", r.Fence, ahead+1)
	}
	infos, err := b.InspectNodes(locktest.Ctx(t, 10*time.Second), k)
	if err != nil {
		t.Fatal(err)
	}
	// Every node that answered in time holds the lease (a node slower
	// than the quorum and its grace is left out: on this loaded machine
	// that happens).
	holding := 0
	var held []int
	for i, n := range infos {
		switch {
		case n.Err == nil && n.Info.Held && n.Info.Owner == r.Token && n.Info.Fence == r.Fence && n.Info.Count == 1:
			holding++
			held = append(held, i)
		case n.Err == nil && !n.Info.Held:
			// Its acquire answered after the fan-out gave up on it, so it
			// got no write-back either.
			t.Logf("node %d answered late and is not part of the lease", i)
			continue
		default:
			t.Errorf("node %d: got %+v, want held by %s with fence %d", i, n, r.Token, r.Fence)
		}
	}
	if holding < 3 {
		t.Fatalf("%d nodes hold the lease, want at least the quorum 3", holding)
	}
	if err := b.Refresh(locktest.Ctx(t, 10*time.Second), r); err != nil {
		t.Fatalf("Refresh with the lease's fence: %v", err)
	}
	stale := r
	stale.Fence--
	if err := b.Release(locktest.Ctx(t, 10*time.Second), stale); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release with another fence: got %v, want ErrNotHeld", err)
	}
	if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Every node that held the lease got the release before Release
	// returned, or gets it shortly after (a node slower than the quorum):
	// then a second Release finds no node holding it.
	for _, i := range held {
		locktest.WaitFor(t, 5*time.Second, "node "+strconv.Itoa(i)+" to leave a tombstone at the fence", func() bool {
			v, err := rdbs[i].Get(context.Background(), lock).Result()
			return err == nil && strings.HasPrefix(v, strconv.FormatUint(r.Fence, 10)+":0:")
		})
	}
	if err := b.Release(locktest.Ctx(t, 10*time.Second), r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release: got %v, want ErrNotHeld", err)
	}
}

// TestMinorityDown: with 2 of 5 nodes out, acquire, refresh and release
// still work, through dlock.Client too.
func TestMinorityDown(t *testing.T) {
	for _, f := range []fault{pause, kill} {
		t.Run(string(f), func(t *testing.T) {
			b := newBackend(t, redlock.WithNodeTimeout(nodeTimeout))
			k := locktest.Key(t)
			restore := f.apply(t, 1, 3)
			start := time.Now()
			r := acquire(t, b, k, 2*time.Second)
			t.Logf("acquired with nodes 1 and 3 out in %v (node timeout %v)", time.Since(start), nodeTimeout)
			if err := b.Refresh(locktest.Ctx(t, 10*time.Second), r); err != nil {
				t.Fatalf("Refresh: %v", err)
			}
			info, err := b.Inspect(locktest.Ctx(t, 10*time.Second), k)
			if err != nil || !info.Held || info.Owner != r.Token || info.Fence != r.Fence {
				t.Fatalf("Inspect: got %+v, %v, want held by the lease", info, err)
			}
			other := req(k, time.Second)
			if g, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), other); err != nil || g.OK {
				t.Fatalf("TryAcquire by another token: got %+v, %v, want not granted", g, err)
			}
			start = time.Now()
			if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
				t.Fatalf("Release: %v", err)
			}
			t.Logf("released in %v", time.Since(start))
			r2 := acquire(t, b, k, 2*time.Second)
			if r2.Fence <= r.Fence {
				t.Fatalf("fence after release: got %d, want > %d", r2.Fence, r.Fence)
			}
			if err := b.Release(locktest.Ctx(t, 10*time.Second), r2); err != nil {
				t.Fatalf("Release: %v", err)
			}

			// The Client: Acquire, auto-renewal across several TTLs, Release.
			c := newClient(t, []redlock.Option{redlock.WithNodeTimeout(nodeTimeout)}, dlock.WithTTL(500*time.Millisecond))
			l, err := c.Acquire(locktest.Ctx(t, 10*time.Second), k)
			if err != nil {
				t.Fatalf("Client.Acquire: %v", err)
			}
			select {
			case <-l.Done():
				t.Fatalf("lease lost with 2 of 5 nodes out: %v", l.Err())
			case <-time.After(2 * time.Second):
			}
			if err := l.Release(locktest.Ctx(t, 10*time.Second)); err != nil {
				t.Fatalf("Lease.Release: %v", err)
			}
			restore()
		})
	}
}

// TestMajorityDown: with 3 of 5 nodes out an attempt fails within the
// node timeout, with one NodeError per node that is out, and leaves
// nothing behind on the two that answered.
func TestMajorityDown(t *testing.T) {
	const timeout = 100 * time.Millisecond
	for _, tc := range []struct {
		name    string
		f       fault
		noRetry bool
	}{
		{"Pause", pause, false},
		{"Kill", kill, false},
		// Refused connections that go-redis does not retry (MaxRetries -1,
		// DialerRetries 1, as the package recommends): the attempt fails
		// as soon as three nodes refused, far within the timeout.
		{"KillNoRetry", kill, true},
	} {
		f := tc.f
		t.Run(tc.name, func(t *testing.T) {
			edit := func(o *redis.Options) {
				if tc.noRetry {
					o.MaxRetries, o.DialerRetries = -1, 1
				}
			}
			b := redlock.NewWithOptions(newClients(t, edit), redlock.WithNodeTimeout(timeout))
			t.Cleanup(func() { b.Close() })
			k := locktest.Key(t)
			restore := f.apply(t, 0, 2, 4)
			var took []time.Duration
			for i := 0; i < 5; i++ {
				start := time.Now()
				g, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), req(k, time.Second))
				took = append(took, time.Since(start))
				if err == nil || g.OK {
					t.Fatalf("TryAcquire with 3 of 5 nodes out: got %+v, %v, want an error", g, err)
				}
				// The three nodes out fail; a node that answers may time out
				// too on a loaded machine (logged, not a failure).
				failed := make(map[string]bool)
				for _, e := range nodeErrs(err) {
					failed[e.Node] = true
				}
				for _, want := range []int{0, 2, 4} {
					if !failed[nodes[want].Addr()] {
						t.Fatalf("no NodeError for node %s, which is out: %v", nodes[want].Addr(), err)
					}
				}
				if len(failed) > 3 {
					t.Logf("attempt %d: %d NodeErrors, an answering node too (loaded machine): %v", i, len(failed), err)
				}
				if errors.Is(err, dlock.ErrNotAcquired) {
					t.Fatalf("error matches ErrNotAcquired, want a server failure: %v", err)
				}
				if i == 0 {
					t.Logf("error: %v", err)
				}
				t.Logf("attempt %d failed after %v (node timeout %v)", i, took[i], timeout)
			}
			// The median, so that one stall of this loaded machine does not
			// fail the test; every figure is logged above.
			slices.Sort(took)
			if med := took[len(took)/2]; med > timeout+timeout/2 {
				t.Errorf("median failed attempt took %v, want within the node timeout %v (+50%% noise)", med, timeout)
			}
			// Nothing left on the nodes that answered: released at once, or
			// (a grant that came after the attempt failed fast) just after.
			var infos []redlock.NodeInfo
			locktest.WaitFor(t, 5*time.Second, "nodes 1 and 3 free after the failed attempts", func() bool {
				var err error
				infos, err = b.InspectNodes(context.Background(), k)
				return err == nil && infos[1].Err == nil && !infos[1].Info.Held && infos[3].Err == nil && !infos[3].Info.Held
			})
			for _, i := range []int{0, 2, 4} {
				if infos[i].Err == nil {
					t.Errorf("node %d is out: got no error from InspectNodes", i)
				}
			}
			// A Client's Acquire reports the failure, not contention.
			c := dlock.New(redlock.NewWithOptions(newClients(t, edit), redlock.WithNodeTimeout(timeout)), dlock.WithTTL(time.Second))
			t.Cleanup(func() { c.Close() })
			if _, err := c.Acquire(locktest.Ctx(t, 10*time.Second), k); err == nil || errors.Is(err, dlock.ErrNotAcquired) || len(nodeErrs(err)) != 3 {
				t.Fatalf("Client.Acquire: got %v, want a failure with three NodeErrors", err)
			}
			// Back: the attempts that the paused nodes still had queued run
			// now (and their grants are given back), so wait.
			restore()
			l := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), c, k)
			if err := l.Release(locktest.Ctx(t, 10*time.Second)); err != nil {
				t.Fatalf("Release after the nodes came back: %v", err)
			}
		})
	}
}

// TestFailFast: when a quorum can no longer be reached the attempt does
// not wait for slow nodes.
func TestFailFast(t *testing.T) {
	const timeout = 2 * time.Second
	b := newBackend(t, redlock.WithNodeTimeout(timeout))
	k := locktest.Key(t)
	plant(t, k, "someone-else", 10*time.Second, 0, 1, 2)
	f := pause
	restore := f.apply(t, 3, 4)
	start := time.Now()
	g, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), req(k, 10*time.Second))
	took := time.Since(start)
	restore()
	if err != nil || g.OK {
		t.Fatalf("TryAcquire: got %+v, %v, want not granted", g, err)
	}
	if g.HolderTTL <= 0 || g.HolderTTL > 10*time.Second {
		t.Fatalf("HolderTTL: got %v, want in (0, 10s]", g.HolderTTL)
	}
	t.Logf("3 nodes held elsewhere, 2 paused: not granted after %v (node timeout %v)", took, timeout)
	if took > timeout/4 {
		t.Fatalf("attempt took %v, want far less than the node timeout %v", took, timeout)
	}
}

// TestSplitVote: when no token holds a quorum the attempt is told to wait
// (not an error), HolderTTL is the time until enough nodes free up, and
// what it took is given back.
func TestSplitVote(t *testing.T) {
	b := newBackend(t, redlock.WithNodeTimeout(nodeTimeout))
	k := locktest.Key(t)
	plant(t, k, "x", 3*time.Second, 0, 1)
	plant(t, k, "y", 6*time.Second, 2, 3)
	g, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), req(k, time.Second))
	if err != nil || g.OK {
		t.Fatalf("TryAcquire: got %+v, %v, want not granted", g, err)
	}
	// One node granted; two more are needed: the second-shortest TTL, x's.
	if g.HolderTTL <= 2*time.Second || g.HolderTTL > 3*time.Second {
		t.Fatalf("HolderTTL: got %v, want in (2s, 3s]", g.HolderTTL)
	}
	infos, err := b.InspectNodes(locktest.Ctx(t, 10*time.Second), k)
	if err != nil {
		t.Fatal(err)
	}
	if infos[4].Err != nil || infos[4].Info.Held {
		t.Fatalf("node 4 after the failed attempt: got %+v, want not held", infos[4])
	}
	info, err := b.Inspect(locktest.Ctx(t, 10*time.Second), k)
	if err != nil || info.Held {
		t.Fatalf("Inspect of a split lock: got %+v, %v, want not held", info, err)
	}
	removed, err := b.ForceRelease(locktest.Ctx(t, 10*time.Second), k)
	if err != nil || removed.Held {
		t.Fatalf("ForceRelease of a split lock: got %+v, %v, want nothing held by a quorum", removed, err)
	}
	r := acquire(t, b, k, time.Second)
	if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestRestartEmpty: nodes whose fences ran ahead of the others are
// restarted empty; the next fences are still higher, because the nodes
// that held the lease keep a tombstone at its fence after the release.
func TestRestartEmpty(t *testing.T) {
	b := newBackend(t, redlock.WithNodeTimeout(nodeTimeout))
	k := locktest.Key(t)
	rdbs := newClients(t)
	lock := redislock.New(rdbs[0]).LockName(k)
	ahead := uint64(time.Now().UnixMicro()) + 1e9 // clocks 1000s ahead
	for _, i := range []int{0, 4} {
		if err := rdbs[i].Set(context.Background(), lock, tombstone(ahead), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	r := acquire(t, b, k, time.Second)
	if r.Fence <= ahead {
		t.Fatalf("fence: got %d, want > %d", r.Fence, ahead)
	}
	if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
		t.Fatal(err)
	}
	last := r.Fence
	for _, i := range []int{0, 4} {
		if err := nodes[i].Restart(); err != nil {
			t.Fatal(err)
		}
	}
	for n := 0; n < 3; n++ {
		r := acquire(t, b, k, time.Second)
		if r.Fence <= last {
			t.Fatalf("fence %d after nodes 0 and 4 restarted empty: got %d, want > %d", n, r.Fence, last)
		}
		last = r.Fence
		if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRefreshQuorum: Refresh succeeds while a quorum holds the lock and
// reports ErrNotHeld once a quorum does not.
func TestRefreshQuorum(t *testing.T) {
	// Every node must answer each call: the test counts the nodes holding
	// the lock.
	b := newBackend(t, redlock.WithNodeTimeout(time.Second))
	nbs := nodeBackends(t)
	r := acquireEverywhere(t, b, nbs, 5*time.Second)
	k := r.Key
	for i, want := range []error{nil, nil, dlock.ErrNotHeld} {
		if _, err := nbs[i].ForceRelease(locktest.Ctx(t, 10*time.Second), k); err != nil {
			t.Fatal(err)
		}
		err := b.Refresh(locktest.Ctx(t, 10*time.Second), r)
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Fatalf("Refresh with the lock deleted on %d nodes: got %v, want %v", i+1, err, want)
		}
		if want == nil {
			if err := b.RefreshMany(locktest.Ctx(t, 10*time.Second), []dlock.Request{r})[0]; err != nil {
				t.Fatalf("RefreshMany with the lock deleted on %d nodes: %v", i+1, err)
			}
		}
	}
	if err := b.RefreshMany(locktest.Ctx(t, 10*time.Second), []dlock.Request{r})[0]; !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("RefreshMany with the lock deleted on 3 nodes: got %v, want ErrNotHeld", err)
	}
	// Release of a lease no quorum holds reports it (ErrNotHeld) and still
	// frees the two nodes that hold it.
	if err := b.Release(locktest.Ctx(t, 10*time.Second), r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release on the 2 nodes that hold it: got %v, want ErrNotHeld", err)
	}
	info, err := b.Inspect(locktest.Ctx(t, 10*time.Second), k)
	if err != nil || info.Held {
		t.Fatalf("Inspect after Release: got %+v, %v, want not held", info, err)
	}
}

func TestRefreshMany(t *testing.T) {
	// Every node must answer each call, and hold each lock: with two
	// nodes paused the other three make the quorum.
	b := newBackend(t, redlock.WithNodeTimeout(time.Second))
	nbs := nodeBackends(t)
	var rs []dlock.Request
	for i := 0; i < 4; i++ {
		rs = append(rs, acquireEverywhere(t, b, nbs, 5*time.Second))
	}
	foreign := req(locktest.Key(t), 5*time.Second)
	invalid := req("", 5*time.Second)
	errs := b.RefreshMany(locktest.Ctx(t, 10*time.Second), append(rs, foreign, invalid))
	for i := range rs {
		if errs[i] != nil {
			t.Errorf("request %d: got %v, want nil", i, errs[i])
		}
	}
	if !errors.Is(errs[4], dlock.ErrNotHeld) {
		t.Errorf("foreign token: got %v, want ErrNotHeld", errs[4])
	}
	if !errors.Is(errs[5], dlock.ErrInvalidKey) {
		t.Errorf("empty key: got %v, want ErrInvalidKey", errs[5])
	}
	restore := pause.apply(t, 0, 1)
	errs = b.RefreshMany(locktest.Ctx(t, 10*time.Second), rs)
	restore()
	for i := range rs {
		if errs[i] != nil {
			t.Errorf("request %d with 2 nodes paused: got %v, want nil", i, errs[i])
		}
	}
	for _, r := range rs {
		if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
			t.Errorf("Release: %v", err)
		}
	}
}

// TestWrongType: a key holding another type of value on a majority of the
// nodes fails acquisitions with ErrWrongType; on a minority it does not.
func TestWrongType(t *testing.T) {
	b := newBackend(t, redlock.WithNodeTimeout(nodeTimeout))
	k := locktest.Key(t)
	rdbs := newClients(t)
	lock := redislock.New(rdbs[0]).LockName(k)
	if err := rdbs[0].RPush(context.Background(), lock, "x").Err(); err != nil {
		t.Fatal(err)
	}
	r := acquire(t, b, k, time.Second)
	if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, i := range []int{1, 2} {
		// DEL first: the release may have left a tombstone.
		if err := rdbs[i].Del(context.Background(), lock).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdbs[i].RPush(context.Background(), lock, "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	_, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), req(k, time.Second))
	if !errors.Is(err, dlock.ErrWrongType) || len(nodeErrs(err)) != 3 {
		t.Fatalf("TryAcquire with a list on 3 nodes: got %v, want ErrWrongType from 3 nodes", err)
	}
	for i := 0; i < 3; i++ {
		if n, err := rdbs[i].LLen(context.Background(), lock).Result(); n != 1 || err != nil {
			t.Fatalf("node %d list: got length %d (%v), want 1: untouched", i, n, err)
		}
	}
}

// TestWokenWithMinorityDown: a waiter subscribed while 2 of 5 nodes are
// paused is woken by the release, well before the holder's TTL.
func TestWokenWithMinorityDown(t *testing.T) {
	k := locktest.Key(t)
	// A node timeout a loaded machine does not reach: the three nodes up
	// must answer the release.
	bopts := []redlock.Option{redlock.WithNodeTimeout(time.Second), redlock.WithSubscribeTimeout(time.Second)}
	hc := newClient(t, bopts, dlock.WithTTL(20*time.Second))
	// The holder must hold every node: a node that answered after the
	// quorum is given back, and with two nodes paused the release would
	// then lack a quorum.
	look := newBackend(t)
	var holder *dlock.Lease
	for holder == nil {
		l, err := hc.Acquire(locktest.Ctx(t, 10*time.Second), k)
		if err != nil {
			t.Fatal(err)
		}
		infos, err := look.InspectNodes(locktest.Ctx(t, 10*time.Second), k)
		held := 0
		for _, in := range infos {
			if in.Err == nil && in.Info.Held {
				held++
			}
		}
		if err == nil && held == len(infos) {
			holder = l
			break
		}
		if err := l.Release(locktest.Ctx(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		k = locktest.Key(t)
	}
	restore := pause.apply(t, 2, 4)
	waiting, waits := locktest.Waiting()
	c := newClient(t, bopts, dlock.WithTTL(time.Second), dlock.WithWait(dlock.Constant(time.Minute)), waiting)
	got := make(chan error, 1)
	var l *dlock.Lease
	go func() {
		var err error
		l, err = c.Acquire(locktest.Ctx(t, time.Minute), k)
		got <- err
	}()
	select { // the waiter lost its first attempt and waits
	case <-waits:
	case err := <-got:
		t.Fatalf("waiter returned before it waited: %v", err)
	}
	released := time.Now()
	if err := holder.Release(locktest.Ctx(t, 10*time.Second)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		t.Logf("waiter acquired %v after the release", time.Since(released))
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken within 10s of the release (holder TTL 20s)")
	}
	restore()
	if err := l.Release(locktest.Ctx(t, 10*time.Second)); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestLateGrantGivenBack: a node paused during an acquisition answers
// after it was given up; its grant is given back once it resumes, and
// does not disturb the lease.
func TestLateGrantGivenBack(t *testing.T) {
	b := newBackend(t, redlock.WithNodeTimeout(nodeTimeout))
	k := locktest.Key(t)
	restore := pause.apply(t, 4)
	r := acquire(t, b, k, 3*time.Second)
	restore()
	locktest.WaitFor(t, 5*time.Second, "node 4 to give back its late grant", func() bool {
		infos, err := b.InspectNodes(context.Background(), k)
		return err == nil && infos[4].Err == nil && !infos[4].Info.Held
	})
	infos, err := b.InspectNodes(locktest.Ctx(t, 10*time.Second), k)
	if err != nil {
		t.Fatal(err)
	}
	holding := 0
	for i := 0; i < 4; i++ {
		if n := infos[i]; n.Err == nil && n.Info.Held && n.Info.Owner == r.Token && n.Info.Fence == r.Fence {
			holding++
		}
	}
	if holding < 3 {
		t.Fatalf("%d of nodes 0-3 hold the lease, want at least the quorum 3: %+v", holding, infos)
	}
	if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func TestInspectForceRelease(t *testing.T) {
	b := newBackend(t, redlock.WithNodeTimeout(nodeTimeout))
	k := locktest.Key(t)
	info, err := b.Inspect(locktest.Ctx(t, 10*time.Second), k)
	if err != nil || info.Held || info.Key != k || info.Waiters != -1 {
		t.Fatalf("Inspect of a free lock: got %+v, %v", info, err)
	}
	r := acquire(t, b, k, 5*time.Second)
	info, err = b.Inspect(locktest.Ctx(t, 10*time.Second), k)
	if err != nil || !info.Held || info.Owner != r.Token || info.Fence != r.Fence || info.Count != 1 || info.TTL <= 0 || info.TTL > 5*time.Second {
		t.Fatalf("Inspect of a held lock: got %+v, %v", info, err)
	}

	// 3 of 5 paused: the verdict is open, so Inspect says so.
	restore := pause.apply(t, 0, 1, 2)
	_, err = b.Inspect(locktest.Ctx(t, 10*time.Second), k)
	if len(nodeErrs(err)) != 3 {
		t.Fatalf("Inspect with 3 nodes paused: got %v, want three NodeErrors", err)
	}
	restore()

	removed, err := b.ForceRelease(locktest.Ctx(t, 10*time.Second), k)
	if err != nil || !removed.Held || removed.Owner != r.Token || removed.Fence != r.Fence {
		t.Fatalf("ForceRelease: got %+v, %v, want the lease's lock", removed, err)
	}
	if err := b.Refresh(locktest.Ctx(t, 10*time.Second), r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh after ForceRelease: got %v, want ErrNotHeld", err)
	}
	if err := b.Release(locktest.Ctx(t, 10*time.Second), r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release after ForceRelease: got %v, want ErrNotHeld", err)
	}
	r2 := acquire(t, b, k, time.Second)
	if r2.Fence <= r.Fence {
		t.Fatalf("fence after ForceRelease: got %d, want > %d", r2.Fence, r.Fence)
	}
}

// TestReentrantFreshNode: a reentrant owner re-enters after a node that
// missed the first acquisition came back; the nested grant keeps the
// outer fence and both holds release cleanly.
func TestReentrantFreshNode(t *testing.T) {
	k := locktest.Key(t)
	// No go-redis retries (as the package recommends): a retried dial
	// would deliver the killed node's acquire once it is back.
	c := dlock.New(redlock.NewWithOptions(newClients(t, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 }), redlock.WithNodeTimeout(nodeTimeout)),
		dlock.WithTTL(2*time.Second), dlock.WithOwner("job-"+k))
	t.Cleanup(func() { c.Close() })
	restore := kill.apply(t, 3)
	outer := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), c, k)
	restore()
	inner := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), c, k)
	if inner.Fence() != outer.Fence() || inner.Count() != 2 {
		t.Fatalf("nested grant: got fence %d count %d, want fence %d count 2", inner.Fence(), inner.Count(), outer.Fence())
	}
	if err := inner.Release(locktest.Ctx(t, 10*time.Second)); err != nil {
		t.Fatalf("inner Release: %v", err)
	}
	b := newBackend(t, redlock.WithNodeTimeout(nodeTimeout))
	info, err := b.Inspect(locktest.Ctx(t, 10*time.Second), k)
	if err != nil || !info.Held || info.Fence != outer.Fence() {
		t.Fatalf("after the inner release: got %+v, %v, want held with the outer fence", info, err)
	}
	if err := outer.Release(locktest.Ctx(t, 10*time.Second)); err != nil {
		t.Fatalf("outer Release: %v", err)
	}
	// Release returns once a quorum released; the others follow.
	locktest.WaitFor(t, 5*time.Second, "every node free after the last release", func() bool {
		infos, err := b.InspectNodes(context.Background(), k)
		if err != nil {
			return false
		}
		for _, n := range infos {
			if n.Err != nil || n.Info.Held {
				return false
			}
		}
		return true
	})
}

// TestDelayedRestartRule shows the assumption the package documents: a
// node that restarts empty at once can hand a second owner a lock that is
// still validly held; one that stays out until the first lease expired
// cannot.
func TestDelayedRestartRule(t *testing.T) {
	noRetry := func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 }
	newB := func() *redlock.Backend {
		b := redlock.NewWithOptions(newClients(t, noRetry), redlock.WithNodeTimeout(nodeTimeout))
		t.Cleanup(func() { b.Close() })
		return b
	}
	a, b := newB(), newB()

	t.Run("ImmediateRestartBreaksExclusion", func(t *testing.T) {
		k := locktest.Key(t)
		restore34 := kill.apply(t, 3, 4)
		invoke := time.Now()
		ra := acquire(t, a, k, 10*time.Second) // on nodes 0, 1, 2
		validUntil := invoke.Add(10*time.Second - redlock.Drift(10*time.Second))
		if err := nodes[2].Restart(); err != nil { // at once, empty
			t.Fatal(err)
		}
		restore34()
		rb := req(k, 10*time.Second)
		g, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), rb)
		if err != nil || !g.OK {
			t.Fatalf("second owner: got %+v, %v; want the lock granted (nodes 2, 3, 4), showing why the rule is needed", g, err)
		}
		if !time.Now().Before(validUntil) {
			t.Fatal("the first lease expired meanwhile: nothing shown")
		}
		t.Logf("two owners hold %q: the first until +%v, the second from now", k, time.Until(validUntil).Round(time.Millisecond))
		rb.Fence = g.Fence
		b.Release(locktest.Ctx(t, 10*time.Second), rb)
		a.Release(locktest.Ctx(t, 10*time.Second), ra)
	})

	t.Run("DelayedRestartKeepsExclusion", func(t *testing.T) {
		k := locktest.Key(t)
		const ttl = 500 * time.Millisecond
		restore34 := kill.apply(t, 3, 4)
		// The lease is valid for TTL − drift from the acquisition's invoke
		// (the nodes set their keys after it), not from its return: on a
		// loaded machine the acquisition takes a good part of the TTL.
		invoke := time.Now()
		ra := acquire(t, a, k, ttl) // on nodes 0, 1, 2
		validUntil := invoke.Add(ttl - redlock.Drift(ttl))
		restore2 := kill.apply(t, 2) // stays out until ra expired
		restore34()
		probes := 0
		for ; time.Now().Before(validUntil); probes++ { // back to back
			g, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), req(k, ttl))
			if g.OK {
				t.Fatalf("second owner granted while the first lease is valid (err %v)", err)
			}
		}
		t.Logf("%d probes refused while the first lease was valid", probes)
		// Node 2 stays out until the first lease's keys expired on the
		// nodes that hold them.
		locktest.WaitFor(t, 10*time.Second, "the first lease expired on nodes 0 and 1", func() bool {
			infos, err := a.InspectNodes(context.Background(), k)
			return err == nil && infos[0].Err == nil && infos[1].Err == nil && !infos[0].Info.Held && !infos[1].Info.Held
		})
		restore2()
		rb := acquire(t, b, k, ttl)
		if err := b.Release(locktest.Ctx(t, 10*time.Second), rb); err != nil {
			t.Fatalf("Release: %v", err)
		}
		_ = ra
	})
}

// writeBacks counts the fence write-backs a go-redis client sends: the
// scripts run with two keys (lock and counter), where redislock's acquire,
// refresh and release scripts take four and one.
type writeBacks struct{ n atomic.Int64 }

func (w *writeBacks) count(cmd redis.Cmder) {
	a := cmd.Args()
	// agree.lua: one key, then two node tokens (both with "~").
	if name := cmd.Name(); (name == "evalsha" || name == "eval") && len(a) == 7 && fmt.Sprint(a[2]) == "1" &&
		strings.Contains(fmt.Sprint(a[4]), "~") && strings.Contains(fmt.Sprint(a[5]), "~") {
		w.n.Add(1)
	}
}
func (w *writeBacks) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *writeBacks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.count(cmd)
		return next(ctx, cmd)
	}
}
func (w *writeBacks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			w.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestFloorAgreement: on healthy nodes the nodes issue the proposed
// floor, so an acquisition needs no write-back, and every node's lock
// carries the fence. (An acquisition in which a node answers after the
// quorum's grace, which a loaded machine makes happen, takes the
// write-back path instead: at least one of twenty must go without.)
// Inspect reports the lease's token either way.
func TestFloorAgreement(t *testing.T) {
	rdbs := newClients(t)
	wbs := make([]*writeBacks, len(rdbs))
	for i, rdb := range rdbs {
		wbs[i] = &writeBacks{}
		rdb.AddHook(wbs[i])
	}
	b := redlock.NewWithOptions(rdbs, redlock.WithNodeTimeout(time.Second))
	t.Cleanup(func() { b.Close() })
	k := locktest.Key(t)
	lock := redislock.New(rdbs[0]).LockName(k)
	var last uint64
	agreed := 0
	for n := range 20 {
		for _, w := range wbs {
			w.n.Store(0)
		}
		r := acquire(t, b, k, 5*time.Second)
		if r.Fence <= last {
			t.Fatalf("fence %d: got %d, want > %d", n, r.Fence, last)
		}
		last = r.Fence
		ok := true
		for i, w := range wbs {
			v, err := rdbs[i].Get(context.Background(), lock).Result()
			ok = ok && w.n.Load() == 0 && err == nil && strings.HasPrefix(v, strconv.FormatUint(r.Fence, 10)+":1:")
		}
		if ok {
			agreed++
		}
		info, err := b.Inspect(locktest.Ctx(t, 10*time.Second), k)
		if err != nil || !info.Held || info.Owner != r.Token || info.Fence != r.Fence {
			t.Fatalf("Inspect: got %+v, %v, want held by %s with fence %d", info, err, r.Token, r.Fence)
		}
		if err := b.Refresh(locktest.Ctx(t, 10*time.Second), r); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	t.Logf("%d of 20 acquisitions needed no write-back", agreed)
	if agreed == 0 {
		t.Fatalf("every acquisition wrote the fence back, want the nodes to agree on the floor")
	}
}

// TestRefreshManyLargeBatch: a batch far larger than what a node can
// refresh within the node timeout still succeeds: the timeout of a batch
// grows with its size (the lease validity counts the time it took).
func TestRefreshManyLargeBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("takes a few thousand locks")
	}
	n := 3000
	if raceEnabled {
		n = 1000 // still several node timeouts per batch
	}
	b := newBackend(t) // the default node timeout: 50ms for this TTL
	base := locktest.Key(t)
	rs := make([]dlock.Request, n)
	if err := scale.Each(n, 8, func(i int) error {
		r := req(base+strconv.Itoa(i), time.Minute)
		// The setup, not what is tested: on a loaded machine a node may
		// miss the 50ms node timeout, so an attempt that failed is retried
		// (until the failed attempt's holds are given back in the
		// background, the next one finds the lock held).
		ctx := locktest.Ctx(t, 10*time.Second)
		g, err := b.TryAcquire(ctx, r)
		for (err != nil || !g.OK) && ctx.Err() == nil {
			g, err = b.TryAcquire(ctx, r)
		}
		if err != nil || !g.OK {
			return fmt.Errorf("TryAcquire %d: got %+v, %v, want a grant", i, g, err)
		}
		r.Fence = g.Fence
		rs[i] = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, r := range rs {
			b.Release(locktest.Ctx(t, 10*time.Second), r)
		}
	})
	start := time.Now()
	errs := b.RefreshMany(locktest.Ctx(t, 30*time.Second), rs)
	failed := 0
	for i, err := range errs {
		if err != nil {
			if failed == 0 {
				t.Errorf("request %d: got %v, want nil", i, err)
			}
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d refreshes failed", failed, n)
	}
	t.Logf("refreshed %d locks on %d nodes in %v", n, len(nodes), time.Since(start))
}

// TestManyLeasesAutoRenew: one Client holds 3,000 Redlock leases with the
// watchdog for three TTLs; none may be lost. Each renewal tick refreshes
// them all in one batch per node, which takes longer than the node
// timeout meant for one call (TestRefreshManyLargeBatch).
func TestManyLeasesAutoRenew(t *testing.T) {
	if testing.Short() {
		t.Skip("holds a few thousand locks for seconds")
	}
	const ttl = 2 * time.Second
	n := 3000
	if raceEnabled {
		// The race detector slows the client about tenfold: 300 leases
		// still take several node timeouts per batch, and 1,000 missed
		// the TTL next to another test package on 2 cores.
		n = 300
	}
	c := newClient(t, nil, dlock.WithTTL(ttl))
	base := locktest.Key(t)
	leases := make([]*dlock.Lease, n)
	if err := scale.Each(n, 8, func(i int) error {
		// An acquisition that a loaded node answered too late for fails
		// (the quorum was not reached in time): try again.
		ctx := locktest.Ctx(t, 30*time.Second)
		for leases[i] == nil {
			l, err := c.Acquire(ctx, base+strconv.Itoa(i))
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("Acquire %d: %w", i, err)
			}
			leases[i] = l
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, l := range leases {
			l.Release(locktest.Ctx(t, 10*time.Second))
		}
	})
	hold := time.NewTimer(3 * ttl)
	defer hold.Stop()
	select {
	case <-hold.C:
	case <-leases[0].Done(): // the first-acquired lease renews first
		t.Fatalf("lease lost during the hold: %v", leases[0].Err())
	}
	lost := 0
	for _, l := range leases {
		if err := l.Err(); err != nil {
			if lost == 0 {
				t.Errorf("lease %q: %v", l.Key(), err)
			}
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d leases lost", lost, n)
	}
}
