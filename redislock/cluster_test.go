package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestCluster runs the backend on a real three-node Redis Cluster through
// go-redis' *redis.ClusterClient: the key layout and every operation on
// locks spread over all the nodes, the conformance suite (with FIFO), and
// multi-key locks across slots.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	cluster, err := testserver.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(); err != nil {
			t.Error(err)
		}
	})
	newCC := func(t *testing.T) *redis.ClusterClient {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	t.Run("Keys", func(t *testing.T) { clusterKeys(t, newCC(t), cluster) })
	t.Run("Conformance", func(t *testing.T) {
		dlocktest.Run(t, dlocktest.Harness{
			NewBackend: func(t *testing.T) dlock.Backend { return redislock.New(newCC(t)) },
			TTL:        500 * time.Millisecond,
			FIFO:       true,
		})
	})
	t.Run("Groups", func(t *testing.T) { clusterGroups(t, newCC(t)) })
	t.Run("AcquireManyAcrossSlots", func(t *testing.T) { clusterAcquireMany(t, newCC) })
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
			if n := rdb.Exists(ctx, b.LockName(k)).Val(); n != 0 {
				t.Fatalf("lock left behind: EXISTS got %d, want 0", n)
			}
		}
	})
}

// clusterKeys checks with CLUSTER KEYSLOT that the lock, fence counter,
// queue and channel of a key share one slot (the hash tag {key}), and that
// every operation works on locks spread over all the nodes.
func clusterKeys(t *testing.T, rdb *redis.ClusterClient, cluster *testserver.Cluster) {
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)

	keys := []string{
		"order:1001", "a", "}starts-with-close", `\backslash`, "a}b", "{tagged}x", "x{y}z", "{", "}", "{}",
		key(t), key(t), key(t), key(t), key(t), key(t),
	}
	slots := map[int64]bool{}
	for _, k := range keys {
		lock := b.LockName(k)
		names := []string{lock, lock + ":rel", lock + ":q", lock + ":w:" + "member"}
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
	rdb2 := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { rdb2.Close() })
	holder := newClient(t, rdb2)
	for _, k := range keys[:6] {
		h, err := holder.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := c.Acquire(ctx, k)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		waitFor(t, 5*time.Second, "the waiter to queue", func() bool {
			return rdb.ZCard(ctx, b.LockName(k)+":q").Val() > 0
		})
		released := time.Now()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(released); d > time.Second {
				t.Fatalf("waiter on %q acquired %v after the release, want promptly", k, d)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter on %q not woken by the release", k)
		}
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
		mu     sync.Mutex
		inside = map[string]int{}
		fences = map[string]uint64{}
		wg     sync.WaitGroup
		errc   = make(chan error, workers)
		took   = make([]time.Duration, workers)
	)
	ctx := ctxT(t, 2*time.Minute)
	for w := 0; w < workers; w++ {
		c := newClient(t, newCC(t), dlock.WithTTL(5*time.Second))
		rng := rand.New(rand.NewPCG(uint64(w), 42))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				n := 2 + rng.IntN(3)
				perm := rng.Perm(len(pool))[:n]
				keys := make([]string, n)
				for j, p := range perm {
					keys[j] = pool[p]
				}
				start := time.Now()
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				ls, err := c.AcquireMany(cctx, keys)
				cancel()
				if err != nil {
					errc <- fmt.Errorf("worker %d round %d: AcquireMany(%v): %w", w, i, keys, err)
					return
				}
				took[w] = max(took[w], time.Since(start))
				mu.Lock()
				for _, l := range ls {
					inside[l.Key()]++
					if inside[l.Key()] != 1 {
						errc <- fmt.Errorf("key %q held twice", l.Key())
					}
					if l.Fence() <= fences[l.Key()] {
						errc <- fmt.Errorf("key %q: fence %d after %d", l.Key(), l.Fence(), fences[l.Key()])
					}
					fences[l.Key()] = l.Fence()
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // hold
				mu.Lock()
				for _, l := range ls {
					inside[l.Key()]--
				}
				mu.Unlock()
				for _, l := range ls {
					if err := l.Release(ctx); err != nil {
						errc <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("%d workers × %d rounds over groups %v: longest AcquireMany %v", workers, rounds, groups, slices.Max(took))
}

// The client types the backend accepts.
var (
	_ redislock.Client = (*redis.Client)(nil)
	_ redislock.Client = (*redis.ClusterClient)(nil)
	_ redislock.Client = redis.UniversalClient(nil)
)
