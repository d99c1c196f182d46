package redlock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// beforeWriteBack runs fn once, before the first fence write-back
// (redislock's Adopt: one key, the attempt's token, to) that one of the
// go-redis clients sharing it sends; every write-back waits for fn.
type beforeWriteBack struct {
	to   string
	once *sync.Once
	fn   func()
}

func (h beforeWriteBack) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h beforeWriteBack) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if name := cmd.Name(); (name == "evalsha" || name == "eval") && len(a) == 7 &&
			fmt.Sprint(a[2]) == "1" && fmt.Sprint(a[5]) == h.to {
			h.once.Do(h.fn)
		}
		return next(ctx, cmd)
	}
}
func (h beforeWriteBack) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestReentryDuringFreshGrant: two Backends (two processes) share an
// owner token. A's first acquisition is granted on every node, but node 4
// answers A too late (a delaying proxy), so A settles its fence over nodes
// 0–3. Between A's grants and its fence write-back, B acquires the same
// key for the same owner, reentrant, and sees all five nodes. Both may be
// granted only as one hold with one fence: B must not report (and write
// back) a fence of its own, or one of the two leases reports a fence the
// nodes do not hold (its Refresh fails, and the later-registered lease of
// the owner reports a lower fence than the earlier). B is either refused
// (A's grant is not settled yet) or joins A's grant with A's fence; once A
// returned, B re-enters with A's fence.
func TestReentryDuringFreshGrant(t *testing.T) {
	k := locktest.Key(t)
	owner := "job-" + k
	const ttl = 5 * time.Second
	b := newBackend(t, redlock.WithNodeTimeout(nodeTimeout))
	direct := newClients(t)
	nb := redislock.New(direct[4])
	t.Cleanup(func() { nb.Close() })
	lock := nb.LockName(k)

	var (
		gb   dlock.Grant
		errB error
		once sync.Once
	)
	joinB := func() {
		// Node 4 runs A's delayed acquire script before B starts.
		if !locktest.Poll(10*time.Second, func() bool { return direct[4].Exists(context.Background(), lock).Val() != 0 }) {
			t.Errorf("node 4 never got A's acquire")
			return
		}
		gb, errB = b.TryAcquire(locktest.Ctx(t, 10*time.Second), dlock.Request{Key: k, Token: owner, TTL: ttl, Reentrant: true})
	}
	var rdbs []*redis.Client
	for i, n := range nodes {
		addr := n.Addr()
		if i == 4 {
			addr = startDelayProxy(t, addr, 300*time.Millisecond)
		}
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
		t.Cleanup(func() { rdb.Close() })
		if i < 4 {
			rdb.AddHook(beforeWriteBack{to: owner, once: &once, fn: joinB})
		}
		rdbs = append(rdbs, rdb)
	}
	// Connections to the nodes are opened before the attempt, so that only
	// the proxy's delay, not a dial, makes node 4 late: A's attempt is
	// decided by nodes 0–3 (a quorum and a grace as long as that took),
	// long before node 4 runs its script.
	for _, rdb := range rdbs {
		if err := rdb.Ping(locktest.Ctx(t, 10*time.Second)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	a := redlock.NewWithOptions(rdbs, redlock.WithNodeTimeout(2*time.Second))
	t.Cleanup(func() { a.Close() })

	ra := dlock.Request{Key: k, Token: owner, TTL: ttl, Reentrant: true}
	ga, err := a.TryAcquire(locktest.Ctx(t, 10*time.Second), ra)
	if err != nil || !ga.OK {
		t.Fatalf("A: got %+v, %v, want a grant", ga, err)
	}
	ra.Fence = ga.Fence
	t.Logf("A: fence %d count %d; B during A's write-back: %+v, %v", ga.Fence, ga.Count, gb, errB)
	if errB != nil {
		t.Fatalf("B during A's write-back: %v", errB)
	}
	if gb.OK && gb.Fence != ga.Fence {
		t.Errorf("one owner, one hold, two fences: A %d, B %d (B joined A's grant)", ga.Fence, gb.Fence)
	}
	if err := b.Refresh(locktest.Ctx(t, 10*time.Second), ra); err != nil {
		t.Errorf("A's lease, fence %d: Refresh: %v", ga.Fence, err)
	}
	rb := dlock.Request{Key: k, Token: owner, TTL: ttl, Reentrant: true, Fence: gb.Fence}
	if gb.OK {
		if err := b.Refresh(locktest.Ctx(t, 10*time.Second), rb); err != nil {
			t.Errorf("B's lease, fence %d: Refresh: %v", gb.Fence, err)
		}
	}
	// Once A returned, B re-enters A's hold.
	g2, err := b.TryAcquire(locktest.Ctx(t, 10*time.Second), dlock.Request{Key: k, Token: owner, TTL: ttl, Reentrant: true})
	if err != nil || !g2.OK || g2.Fence != ga.Fence || g2.Count < 2 {
		t.Errorf("B after A returned: got %+v, %v, want a re-entry with fence %d", g2, err, ga.Fence)
	}
	r2 := dlock.Request{Key: k, Token: owner, TTL: ttl, Reentrant: true, Fence: g2.Fence}
	for _, r := range []dlock.Request{r2, rb, ra} {
		if r.Fence == 0 || (r == rb && !gb.OK) || (r == r2 && !g2.OK) {
			continue
		}
		_ = b.Release(locktest.Ctx(t, 10*time.Second), r)
	}
}
