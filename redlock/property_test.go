package redlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// TestPropertyFaults makes 1,000 sequential acquisitions of one key by
// three clients while random subsets of the nodes fail: paused and resumed
// (SIGSTOP/SIGCONT), or killed and restarted empty, and while some nodes'
// fence counters jump ahead (a node whose clock runs fast). About 40% of
// the leases are abandoned (no renewal, no release) so the next one must
// wait for their expiry. It checks that
//
//   - every granted fence is higher than the one before;
//   - no lease is granted while the previous one is valid: the next grant
//     returns after the previous lease's Expires (abandoned) or the start
//     of its Release.
//
// The faults keep to the assumptions the package documents: a killed node
// stays down longer than the TTL before it restarts empty (the delayed
// restart rule), and a node is only killed while, without it, a quorum of
// nodes keeps a counter at least as high as the last fence (a majority
// keeps its data). A majority may be paused at once: acquisitions then
// fail, which is counted, not an error.
//
// The seed is DLOCK_REDLOCK_SEED, or 1.
func TestPropertyFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: 1,000 acquisitions with faults")
	}
	seed := uint64(1)
	if s := os.Getenv("DLOCK_REDLOCK_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("DLOCK_REDLOCK_SEED: %v", err)
		}
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	const (
		iterations = 1000
		ttl        = 60 * time.Millisecond
		timeout    = 15 * time.Millisecond
		quorum     = 3
	)
	k := locktest.Key(t)
	bopts := []redlock.Option{redlock.WithNodeTimeout(timeout)}
	var clients []*dlock.Client
	for i := 0; i < 3; i++ {
		c := dlock.New(redlock.NewWithOptions(newClients(t), bopts...), dlock.WithTTL(ttl), dlock.WithAutoRenew(false),
			dlock.WithWait(dlock.Exponential(time.Millisecond, ttl/4)))
		if err := c.Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// A release at Close has the 15 ms node timeout too, which a
			// loaded machine misses on every node; the leases end by their
			// TTL. What the test checks is above.
			if err := c.Close(); err != nil {
				t.Logf("Client.Close: %v", err)
			}
		})
		clients = append(clients, c)
	}
	rdbs := newClients(t, func(o *redis.Options) { o.MaxRetries = -1 })
	lockKey := redislock.New(rdbs[0]).LockName(k)

	// Node states; the cleanup (registered after the clients, so run before
	// they close) brings every node back.
	var (
		paused [5]bool
		downAt [5]time.Time // zero: running
	)
	t.Cleanup(func() {
		for i := range nodes {
			if paused[i] {
				if err := nodes[i].Resume(); err != nil {
					t.Errorf("resume node %d: %v", i, err)
				}
			}
			if !downAt[i].IsZero() {
				time.Sleep(time.Until(downAt[i].Add(ttl))) // the fault: down for a TTL
				if err := nodes[i].Restart(); err != nil {
					t.Errorf("restart node %d: %v", i, err)
				}
			}
		}
	})
	up := func(i int) bool { return !paused[i] && downAt[i].IsZero() }
	pick := func(ok func(int) bool) int {
		var c []int
		for i := range nodes {
			if ok(i) {
				c = append(c, i)
			}
		}
		if len(c) == 0 {
			return -1
		}
		return c[rng.IntN(len(c))]
	}
	var lastFence uint64
	// counterOK reports that node i is known to issue fences above
	// lastFence: its lock (or tombstone) carries a fence ≥ lastFence, or
	// its clock has passed it.
	counterOK := func(i int) bool {
		if !up(i) {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if v, err := rdbs[i].Get(ctx, lockKey).Result(); err == nil {
			if f, _, _ := strings.Cut(v, ":"); parseU(f) >= lastFence {
				return true
			}
		}
		now, err := rdbs[i].Time(ctx).Result()
		return err == nil && uint64(now.UnixMicro()) > lastFence
	}
	var stats struct{ pauses, resumes, kills, restarts, skews, granted, busy, failed, released, abandoned int }

	mutate := func() {
		// Delayed restart: a killed node comes back (empty) only after
		// every lease it could have held has expired.
		for i := range nodes {
			if !downAt[i].IsZero() && time.Since(downAt[i]) > ttl+10*time.Millisecond && rng.IntN(2) == 0 {
				if err := nodes[i].Restart(); err != nil {
					t.Fatalf("restart node %d: %v", i, err)
				}
				downAt[i] = time.Time{}
				stats.restarts++
			}
		}
		if rng.Float64() >= 0.15 {
			return
		}
		switch rng.IntN(4) {
		case 0: // pause
			if i := pick(up); i >= 0 {
				if err := nodes[i].Pause(); err != nil {
					t.Fatalf("pause node %d: %v", i, err)
				}
				paused[i] = true
				stats.pauses++
			}
		case 1: // resume
			if i := pick(func(i int) bool { return paused[i] }); i >= 0 {
				if err := nodes[i].Resume(); err != nil {
					t.Fatalf("resume node %d: %v", i, err)
				}
				paused[i] = false
				stats.resumes++
			}
		case 2: // kill, if a quorum of nodes keeps the last fence without it
			i := pick(up)
			if i < 0 {
				return
			}
			keep := 0
			for j := range nodes {
				if j != i && counterOK(j) {
					keep++
				}
			}
			if keep < quorum {
				return
			}
			if err := nodes[i].Kill(); err != nil {
				t.Fatalf("kill node %d: %v", i, err)
			}
			downAt[i] = time.Now()
			stats.kills++
		case 3: // a free node's fences jump ahead of its clock, as if the
			// clock ran fast: by less than half the TTL, within the clock
			// skew the fences allow, for as long
			if i := pick(up); i >= 0 {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				now, err := rdbs[i].Time(ctx).Result()
				if err != nil {
					cancel()
					return
				}
				skew := uint64(now.UnixMicro()) + 1 + rng.Uint64N(uint64(ttl.Microseconds()/2))
				ok, err := rdbs[i].SetNX(ctx, lockKey, tombstone(skew), ttl/2).Result()
				cancel()
				if err == nil && ok {
					stats.skews++
				}
			}
		}
	}

	var prevEnd time.Time // the previous lease's end of validity
	prevN := -1
	start := time.Now()
	for n := 0; n < iterations; n++ {
		mutate()
		ctx, cancel := context.WithTimeout(context.Background(), 3*ttl)
		l, err := clients[n%3].Acquire(ctx, k)
		returned := time.Now()
		cancel()
		switch {
		case errors.Is(err, dlock.ErrNotAcquired):
			stats.busy++
			continue
		case err != nil:
			stats.failed++
			continue
		}
		stats.granted++
		if l.Fence() <= lastFence {
			t.Fatalf("acquisition %d: fence got %d, want > %d (stats %+v)", n, l.Fence(), lastFence, stats)
		}
		if returned.Before(prevEnd) {
			t.Fatalf("acquisition %d granted at +%v while lease %d was valid until +%v", n, returned.Sub(start), prevN, prevEnd.Sub(start))
		}
		lastFence, prevN = l.Fence(), n
		if rng.Float64() < 0.6 {
			prevEnd = time.Now()
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = l.Release(rctx) // may fail with nodes out: the lock then expires
			cancel()
			stats.released++
		} else {
			prevEnd = l.Expires()
			stats.abandoned++
		}
	}
	t.Logf("%d acquisitions in %v: %+v", iterations, time.Since(start).Round(time.Millisecond), stats)
	if stats.granted < iterations/4 {
		t.Errorf("only %d of %d acquisitions granted: the faults left too little to check", stats.granted, iterations)
	}
}
