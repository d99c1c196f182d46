package redislock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestCluster runs the backend on a real three-node Redis Cluster through
// a *redis.ClusterClient. It checks with CLUSTER KEYSLOT that the lock,
// fence counter and channel of a key share one slot (the hash tag {key}),
// and that every operation works on locks spread over all the nodes.
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
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	t.Cleanup(func() { rdb.Close() })
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)

	keys := []string{
		"order:1001", "a", "}starts-with-close", `\backslash`, "a}b", "{tagged}x", "x{y}z", "{", "}", "{}",
		key(t), key(t), key(t), key(t), key(t), key(t),
	}
	slots := map[int64]bool{}
	for _, k := range keys {
		lock := b.LockName(k)
		names := []string{lock, lock + ":fence", lock + ":rel"}
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
	// Notifications reach the one shared subscription whatever node the
	// lock lives on (PUBLISH is broadcast over the cluster bus).
	c := newClient(t, rdb, dlock.WithWait(dlock.Constant(10*time.Second)))
	holder := newClient(t, redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()}))
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
		waitFor(t, 5*time.Second, "the waiter to subscribe", func() bool {
			m := rdb.PubSubNumSub(ctx, b.LockName(k)+":rel").Val()
			return m[b.LockName(k)+":rel"] > 0
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

// The client types the backend accepts.
var (
	_ redislock.Client = (*redis.Client)(nil)
	_ redislock.Client = (*redis.ClusterClient)(nil)
	_ redislock.Client = redis.UniversalClient(nil)
)
