package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// Part (d): Redlock over 5 independent Redis nodes needs a majority (3).
// With 2 nodes killed, two contending clients still take and release the
// lock, never both at once; with a third node killed, acquisition fails.
// The killed nodes are restarted afterwards (empty) for part (e).
const (
	rlCycles = 20 // acquisitions per client
	rlTTL    = 5 * time.Second
	// rlNodeTimeout is each node's time to answer one call. redlock's
	// default, min(TTL/10, 50ms), suits a LAN; the demo's nodes share a
	// possibly busy machine with everything else the demo runs.
	rlNodeTimeout = 500 * time.Millisecond
)

func partRedlock(ctx context.Context, env *demoEnv, r *partResult) {
	if len(env.redlock) == 0 {
		r.Status = statusSkip
		r.Summary = "skipped: " + env.skip["redlock"]
		r.detail("skipped: %s", env.skip["redlock"])
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var killed []int
	defer func() {
		for _, i := range killed {
			if err := env.redlock[i].Restart(); err != nil {
				r.fail("restarting node %s: %v", env.redlock[i].Addr(), err)
			}
		}
	}()
	kill := func(i int) bool {
		if err := env.redlock[i].Kill(); err != nil {
			r.fail("killing node %s: %v", env.redlock[i].Addr(), err)
			return false
		}
		killed = append(killed, i)
		return true
	}
	if !kill(0) || !kill(1) {
		return
	}
	r.detail("killed 2 of 5 nodes (%s, %s)", env.redlock[0].Addr(), env.redlock[1].Addr())

	clients := make([]*dlock.Client, 2)
	for i := range clients {
		nodes := env.redlockClients()
		defer closeAll(nodes)
		b, err := newRedlockBackend(nodes, rlNodeTimeout)
		if err != nil {
			r.fail("redlock: %v", err)
			return
		}
		clients[i] = dlock.New(b, env.g.clientOptions(dlock.WithTTL(rlTTL))...)
		defer clients[i].Close()
	}
	var (
		inside, overlaps, ok atomic.Int64
		errs                 = make([]error, len(clients))
		fences               sync.Map
		wg                   sync.WaitGroup
	)
	t0 := time.Now()
	for i, c := range clients {
		wg.Go(func() {
			for range rlCycles {
				lease, err := c.Acquire(ctx, "demo:d:job")
				if err != nil {
					errs[i] = err
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				fences.Store(lease.Fence(), true)
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					errs[i] = err
					return
				}
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(t0)
	distinct := 0
	fences.Range(func(any, any) bool { distinct++; return true })
	r.detail("with 3 of 5 nodes up: 2 clients took and released the lock %d times in %v, %d distinct fences, %d overlaps",
		ok.Load(), took.Round(time.Millisecond), distinct, overlaps.Load())
	r.fact("cycles_ok", ok.Load())
	r.fact("overlaps", overlaps.Load())
	if err := errors.Join(errs...); err != nil {
		r.fail("with 2 nodes down: %v", err)
	}
	if overlaps.Load() > 0 {
		r.fail("%d overlaps", overlaps.Load())
	}
	if distinct != int(ok.Load()) {
		r.fail("%d fences for %d grants: fences must be distinct", distinct, ok.Load())
	}

	// A third node down: no majority, no lock.
	if !kill(2) {
		return
	}
	tctx, tcancel := context.WithTimeout(ctx, 3*env.g.timeout)
	lease, err := clients[0].TryAcquire(tctx, "demo:d:job")
	tcancel()
	if err == nil {
		_ = lease.Release(ctx)
		r.fail("with 3 of 5 nodes down the lock was still granted")
	} else {
		r.detail("with 2 of 5 nodes up: refused, as it must be (%s)", shortErr(err))
	}
	r.Summary = fmt.Sprintf("2 of 5 down: %d/%d cycles ok, 0 overlaps; 3 down: refused", ok.Load(), 2*rlCycles)
	if overlaps.Load() > 0 {
		r.Summary = fmt.Sprintf("2 of 5 down: %d overlaps", overlaps.Load())
	}
}

// shortErr keeps long joined errors readable: the first clause, at most
// 160 bytes.
func shortErr(err error) string {
	s := trim(err)
	if i := strings.IndexAny(s, "\n;"); i > 0 {
		s = s[:i]
	}
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return strings.ReplaceAll(s, "\n", "; ")
}
