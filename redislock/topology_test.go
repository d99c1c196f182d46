package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// The backend on the Redis deployments of several servers: a Cluster
// (TestCluster) and a primary with a replica under Sentinel
// (TestSentinel).

// TestCluster runs the backend on a real three-node Redis Cluster through
// go-redis' *redis.ClusterClient: the key layout and every operation on
// locks spread over all the nodes, the conformance suite (with FIFO), and
// multi-key locks across slots.
func TestCluster(t *testing.T) {
	cluster := locktest.Deploy(t, "starts a three-node cluster", testserver.StartCluster)
	newCC := func(t *testing.T) *redis.ClusterClient {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	t.Run("Keys", func(t *testing.T) { clusterKeys(t, newCC) })
	t.Run("Conformance", conformance(func(t *testing.T) redislock.Client { return newCC(t) }, nil))
	t.Run("Groups", func(t *testing.T) { clusterGroups(t, newCC(t)) })
	t.Run("AcquireManyAcrossSlots", func(t *testing.T) { clusterAcquireMany(t, newCC) })
	t.Run("Kinds", func(t *testing.T) { clusterKinds(t, newCC(t)) })
	t.Run("Replicas", func(t *testing.T) {
		// The primaries have no replicas: the WAIT pipeline goes to the
		// primary of each lock's slot, and every acquisition is refused.
		rdb := newCC(t)
		b := newBackend(t, rdb)
		c := dlockClient(t, newCC(t), redislock.WithReplicas(1, 50*time.Millisecond))
		ctx := ctxT(t, 10*time.Second)
		for i := 0; i < 3; i++ {
			k := key(t)
			if _, err := c.Acquire(ctx, k); !errors.Is(err, redislock.ErrNotReplicated) {
				t.Fatalf("Acquire with WithReplicas on a cluster without replicas: got %v, want ErrNotReplicated", err)
			}
			noLock(t, rdb, b, "after the refusal", k)
		}
	})
}

// clusterKeys checks with CLUSTER KEYSLOT that every key of a lock (its
// channel, queue, heartbeats, holds, claims, value and permit queue) shares
// the lock's slot (the hash tag {key}), and that every operation works on
// locks spread over all the nodes.
func clusterKeys(t *testing.T, newCC func(*testing.T) *redis.ClusterClient) {
	rdb := newCC(t)
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)

	keys := []string{
		"order:1001", "a", "}starts-with-close", `\backslash`, "a}b", "{tagged}x", "x{y}z", "{", "}", "{}",
		key(t), key(t), key(t), key(t), key(t), key(t),
	}
	slots := map[int64]bool{}
	for _, k := range keys {
		lock := b.LockName(k)
		names := []string{lock, lock + ":rel", lock + ":q", lock + ":w:member", lock + ":h", lock + ":x", lock + ":v", lock + ":pq"}
		var want int64 = -1
		for _, n := range names {
			slot, err := rdb.ClusterKeySlot(ctx, n).Result()
			if err != nil {
				t.Fatalf("CLUSTER KEYSLOT %q: %v", n, err)
			}
			if want == -1 {
				want = slot
			} else if slot != want {
				t.Fatalf("key %q: CLUSTER KEYSLOT %q = %d, want %d like %q", k, n, slot, want, lock)
			}
		}
		slots[want] = true
	}
	if len(slots) < 3 {
		t.Fatalf("the %d keys hash to %d slots, want them spread", len(keys), len(slots))
	}

	// Every operation, on locks all over the cluster.
	var rs []dlock.Request
	for _, k := range keys {
		r := req(k, time.Minute)
		r.Fence = mustGrant(t, b, r).Fence
		rs = append(rs, r)
	}
	for i, err := range b.RefreshMany(ctx, rs) {
		if err != nil {
			t.Fatalf("RefreshMany on the cluster, %q: %v", rs[i].Key, err)
		}
	}
	for _, r := range rs {
		if err := b.Refresh(ctx, r); err != nil {
			t.Fatalf("Refresh %q: %v", r.Key, err)
		}
		if err := b.Release(ctx, r); err != nil {
			t.Fatalf("Release %q: %v", r.Key, err)
		}
	}
	// Hand-off messages reach the one shared subscription whatever node
	// the lock lives on (PUBLISH is broadcast over the cluster bus).
	c := newClient(t, rdb, dlock.WithWait(dlock.Constant(10*time.Second)))
	holder := newClient(t, newCC(t))
	for _, k := range keys[:6] {
		held := holdKeyOn(t, rdb, holder, k)
		l, d := held.handOff(t, c)
		if d > time.Second {
			t.Fatalf("waiter on %q acquired %v after the release, want promptly", k, d)
		}
		release(t, ctx, l)
	}
	// A foreign value under a lock name, on whatever node.
	rdb.LPush(ctx, b.LockName("list"), "x")
	if _, err := b.TryAcquire(ctx, req("list", time.Second)); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("TryAcquire over a list on the cluster: got %v, want ErrWrongType", err)
	}
}

// clusterGroups checks Slot against CLUSTER KEYSLOT and Groups' runs, and
// that TryAcquireAll refuses keys of different slots.
func clusterGroups(t *testing.T, rdb *redis.ClusterClient) {
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)
	tag := key(t)
	keys := []string{"{" + tag + "}a", "{" + tag + "}b", "{" + tag + "}c", "order:1", "order:2", "}x", `\y`, "a{b}c", "{}", "{"}
	for i := 0; i < 20; i++ {
		keys = append(keys, key(t))
	}
	slices.Sort(keys)
	slots := map[string]int{}
	for _, k := range keys {
		want, err := rdb.ClusterKeySlot(ctx, b.LockName(k)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := redislock.Slot(b.LockName(k)); got != int(want) {
			t.Fatalf("Slot(%q): got %d, want %d (CLUSTER KEYSLOT)", b.LockName(k), got, want)
		}
		slots[k] = int(want)
	}
	groups := b.Groups(keys)
	var flat []string
	multi := false
	for i, g := range groups {
		for _, k := range g {
			if slots[k] != slots[g[0]] {
				t.Fatalf("group %v mixes slots %d and %d", g, slots[g[0]], slots[k])
			}
		}
		if i > 0 && slots[g[0]] == slots[groups[i-1][0]] {
			t.Fatalf("groups %v and %v: adjacent runs of one slot, want one group", groups[i-1], g)
		}
		multi = multi || len(g) > 1
		flat = append(flat, g...)
	}
	if !slices.Equal(flat, keys) {
		t.Fatalf("Groups: got %v, want the keys in order", groups)
	}
	if !multi {
		t.Fatalf("Groups: got %v, want the {tag} keys in one group", groups)
	}
	// One group in one script, all nodes.
	for _, g := range groups {
		rs := make([]dlock.Request, len(g))
		for i, k := range g {
			rs[i] = dlock.Request{Key: k, Token: "groups", TTL: time.Minute}
		}
		gs, err := b.TryAcquireAll(ctx, rs)
		if err != nil {
			t.Fatalf("TryAcquireAll(%v): %v", g, err)
		}
		for i, gr := range gs {
			if !gr.OK {
				t.Fatalf("TryAcquireAll(%v): grant %d not OK", g, i)
			}
			rs[i].Fence = gr.Fence
			if err := b.Release(ctx, rs[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	var a, c string // two keys of different slots
	for _, k := range keys[1:] {
		if slots[k] != slots[keys[0]] {
			a, c = keys[0], k
			break
		}
	}
	_, err := b.TryAcquireAll(ctx, []dlock.Request{{Key: a, Token: "x", TTL: time.Second}, {Key: c, Token: "x", TTL: time.Second}})
	if !errors.Is(err, dlock.ErrInvalidKey) || !strings.Contains(err.Error(), "slot") {
		t.Fatalf("TryAcquireAll across slots: got %v, want ErrInvalidKey naming the slots", err)
	}
}

// clusterAcquireMany runs 8 goroutines, each with its own Client and
// ClusterClient, taking random overlapping sets of keys spread over
// several slots (some sharing a slot through a hash tag) with AcquireMany:
// no deadlock (every call finishes well within its deadline), mutual
// exclusion per key, and increasing fences per key.
func clusterAcquireMany(t *testing.T, newCC func(*testing.T) *redis.ClusterClient) {
	const workers = 8
	rounds := 25
	if raceEnabled {
		rounds = 10
	}
	tag := key(t)
	pool := []string{"{" + tag + "}a", "{" + tag + "}b", "{" + tag + "}c", tag + ".x", tag + ".y", tag + ".z", tag + ".w"}
	b := newBackend(t, newCC(t))
	sorted := slices.Clone(pool)
	slices.Sort(sorted)
	groups := b.Groups(sorted)
	if len(groups) < 3 || len(groups) == len(pool) {
		t.Fatalf("key pool groups: got %v, want several slots and one multi-key group", groups)
	}
	var (
		mu      sync.Mutex
		inside  = map[string]int{}
		fences  = map[string]uint64{}
		took    = make([]time.Duration, workers)
		clients = make([]*dlock.Client, workers)
		rngs    = make([]*rand.Rand, workers)
	)
	for w := range clients {
		clients[w] = newClient(t, newCC(t), dlock.WithTTL(5*time.Second))
		rngs[w] = rand.New(rand.NewPCG(uint64(w), 42))
	}
	ctx := ctxT(t, 2*time.Minute)
	err := locktest.Workers(workers, rounds, func(w, i int) error {
		n := 2 + rngs[w].IntN(3)
		perm := rngs[w].Perm(len(pool))[:n]
		keys := make([]string, n)
		for j, p := range perm {
			keys[j] = pool[p]
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		ls, err := clients[w].AcquireMany(cctx, keys)
		cancel()
		if err != nil {
			return fmt.Errorf("worker %d round %d: AcquireMany(%v): %w", w, i, keys, err)
		}
		took[w] = max(took[w], time.Since(start))
		var errs []error
		mu.Lock()
		for _, l := range ls {
			inside[l.Key()]++
			if inside[l.Key()] != 1 {
				errs = append(errs, fmt.Errorf("key %q held twice", l.Key()))
			}
			if l.Fence() <= fences[l.Key()] {
				errs = append(errs, fmt.Errorf("key %q: fence %d after %d", l.Key(), l.Fence(), fences[l.Key()]))
			}
			fences[l.Key()] = l.Fence()
		}
		mu.Unlock()
		// While the leases are held, the server has them as granted.
		for _, l := range ls {
			if info, err := b.Inspect(ctx, l.Key()); err != nil || info.Owner != l.Owner() || info.Fence != l.Fence() {
				errs = append(errs, fmt.Errorf("key %q held by worker %d (fence %d): the server has %+v, %v", l.Key(), w, l.Fence(), info, err))
			}
		}
		mu.Lock()
		for _, l := range ls {
			inside[l.Key()]--
		}
		mu.Unlock()
		for _, l := range ls {
			errs = append(errs, l.Release(ctx))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d workers × %d rounds over groups %v: longest AcquireMany %v", workers, rounds, groups, slices.Max(took))
}

// clusterKinds takes permits, read holds and a leadership on keys spread
// over the cluster, renewed in one RefreshMany (clusterKeys checks their
// keys' slots).
func clusterKinds(t *testing.T, rdb *redis.ClusterClient) {
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)
	var rs []dlock.Request
	for i := 0; i < 12; i++ {
		k := key(t) + strconv.Itoa(i)
		var r dlock.Request
		switch i % 3 {
		case 0:
			r = kindReq(k, "t", dlock.KindPermit, 2, time.Minute)
		case 1:
			r = kindReq(k, "t", dlock.KindRead, 0, time.Minute)
		default:
			r = dlock.Request{Key: k, Token: "t", TTL: time.Minute, Value: "leader"}
		}
		rs = append(rs, holding(t, b, r))
	}
	for i, err := range b.RefreshMany(ctx, rs) {
		if err != nil {
			t.Fatalf("RefreshMany %+v: %v", rs[i], err)
		}
	}
	for _, r := range rs {
		info, err := b.Inspect(ctx, r.Key)
		if err != nil || !info.Held || info.Kind != r.Kind || (r.Kind == dlock.KindLock && info.Value != "leader") {
			t.Fatalf("Inspect %q: got %+v, %v", r.Key, info, err)
		}
		if err := b.Release(ctx, r); err != nil {
			t.Fatalf("Release %+v: %v", r, err)
		}
	}
}

// The client types the backend accepts.
var (
	_ redislock.Client = (*redis.Client)(nil)
	_ redislock.Client = (*redis.ClusterClient)(nil)
	_ redislock.Client = redis.UniversalClient(nil)
)

// TestSentinel runs the backend on a real Sentinel deployment (one
// primary, one replica, three sentinels) through go-redis' failover
// client: the conformance suite (with FIFO), WithReplicas refusing an
// acquisition the paused replica could not acknowledge, and a failover
// (see sentinelFailover).
func TestSentinel(t *testing.T) {
	s := locktest.Deploy(t, "starts a Sentinel deployment and waits for a failover", testserver.StartSentinel)
	newFC := func(t *testing.T) *redis.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:    s.MasterName(),
			SentinelAddrs: s.SentinelAddrs(),
		})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	// A failover during the conformance run (a stall of the primary over
	// down-after-milliseconds) would lose locks by design: say so if one
	// happened, so that a failure it causes is not taken for a bug.
	master := func() string {
		addr, err := s.MasterAddr(ctxT(t, 5*time.Second))
		if err != nil {
			return err.Error()
		}
		return addr
	}
	before := master()
	t.Run("Conformance", conformance(func(t *testing.T) redislock.Client { return newFC(t) }, nil))
	if after := master(); after != before {
		t.Logf("the primary changed during the conformance run (%s, then %s): a failover loses locks (doc.go)", before, after)
	}
	t.Run("Replicas", func(t *testing.T) { sentinelReplicas(t, s, newFC) })
	t.Run("Failover", func(t *testing.T) { sentinelFailover(t, s, newFC) })
}

// sentinelReplicas: with WithReplicas(1, 300ms) an acquisition succeeds
// while the replica is live; with the replica paused (SIGSTOP) WAIT times
// out, the acquisition fails with ErrNotReplicated and the lock is not
// left behind; resumed, acquisitions succeed again.
func sentinelReplicas(t *testing.T, s *testserver.Sentinel, newFC func(*testing.T) *redis.Client) {
	const wait = 300 * time.Millisecond
	rdb := newFC(t)
	b := newBackend(t, rdb)
	c := dlockClient(t, newFC(t), redislock.WithReplicas(1, wait))
	ctx := ctxT(t, time.Minute)
	k := key(t)
	ways := [][]dlock.Option{nil, {dlock.WithFIFO()}} // without and with FIFO
	for _, opts := range ways {
		l, err := c.Acquire(ctx, k, opts...)
		if err != nil {
			t.Fatalf("Acquire (FIFO %v) with a live replica: %v", len(opts) > 0, err)
		}
		release(t, ctx, l)
	}
	resume := pause(t, s.Replica())
	for _, opts := range ways {
		start := time.Now()
		_, err := c.Acquire(ctx, k, opts...)
		took := time.Since(start)
		if !errors.Is(err, redislock.ErrNotReplicated) {
			t.Fatalf("Acquire (FIFO %v) with the replica paused: got %v, want ErrNotReplicated", len(opts) > 0, err)
		}
		t.Logf("replica paused: %v after %v", err, took)
		if took < wait {
			t.Fatalf("failed after %v, before the WAIT timeout %v", took, wait)
		}
		noLock(t, rdb, b, "on the primary after the refusal", k)
	}
	resume()
	waitFor(t, 20*time.Second, "acquisitions replicated again", func() bool {
		l, err := c.TryAcquire(ctx, k)
		if err != nil {
			return false
		}
		return l.Release(ctx) == nil
	})
}

// sentinelFailover takes locks through a go-redis failover client, kills
// the primary, and takes the lock again on the promoted replica: the fence
// still increases (it is at least the server time in µs), waiters are
// woken by notification on both primaries, and FIFO workers that run
// throughout keep acquiring after the promotion.
func sentinelFailover(t *testing.T, s *testserver.Sentinel, newFC func(*testing.T) *redis.Client) {
	c := newClient(t, newFC(t), dlock.WithTTL(2*time.Second))
	waiter := newClient(t, newFC(t), dlock.WithWait(dlock.Constant(10*time.Second)))
	ctx := ctxT(t, time.Minute)
	k := key(t)

	wokenAfterRelease := func(stage string) uint64 {
		t.Helper()
		held := holdKeyOn(t, newFC(t), c, k)
		w, d := held.handOff(t, waiter)
		if d > time.Second {
			t.Fatalf("%s: waiter acquired %v after the release, want promptly", stage, d)
		}
		if w.Fence() <= held.h.Fence() {
			t.Fatalf("%s: waiter's fence %d, want > %d", stage, w.Fence(), held.h.Fence())
		}
		release(t, ctx, w)
		return w.Fence()
	}
	before := wokenAfterRelease("before the failover")

	// FIFO workers on another key, running through the failover.
	const workers = 4
	var (
		promoted atomic.Bool
		acquired [workers]atomic.Int64 // acquisitions after the promotion
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	fk := key(t)
	for w := 0; w < workers; w++ {
		wc := newClient(t, newFC(t), dlock.WithTTL(2*time.Second), dlock.WithFIFO())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				l, err := wc.Acquire(actx, fk)
				cancel()
				if err != nil {
					continue // the failover: errors until the client finds the new primary
				}
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err = l.Release(rctx)
				cancel()
				if err == nil && promoted.Load() {
					acquired[w].Add(1)
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

	old, err := s.MasterAddr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Primary().Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the sentinels to promote the replica", func() bool {
		addr, err := s.MasterAddr(ctx)
		return err == nil && addr != old
	})
	promoted.Store(true)
	promotedAt := time.Now()
	waitFor(t, 30*time.Second, "every FIFO worker acquiring on the new primary", func() bool {
		for w := range acquired {
			if acquired[w].Load() < 5 {
				return false
			}
		}
		return true
	})
	t.Logf("all %d FIFO workers acquired 5 times on the new primary within %v of the promotion", workers, time.Since(promotedAt).Round(time.Millisecond))
	// The failover client finds the new primary by itself.
	waitFor(t, 30*time.Second, "a lock on the new primary", func() bool {
		l, err := c.TryAcquire(ctx, k+".probe")
		if err != nil {
			return false
		}
		l.Release(ctx)
		return true
	})
	after := wokenAfterRelease("after the failover")
	if after <= before {
		t.Fatalf("fence after the failover: got %d, want > %d", after, before)
	}
}
