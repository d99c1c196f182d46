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

// partRedlock runs part (d): two clients contend on Redlock with 2 of 5
// nodes killed, then a third node is killed and the lock must be refused.
func partRedlock(ctx context.Context, env *demoEnv, r *partResult) {
	if len(env.redlock) == 0 {
		r.Status = statusSkip
		r.Summary = "skipped: " + env.skip["redlock"]
		r.detail("skipped: %s", env.skip["redlock"])
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d := &redlockDemo{env: env, r: r}
	defer d.restartKilled()
	if !d.kill(0) || !d.kill(1) {
		return
	}
	r.detail("killed 2 of 5 nodes (%s, %s)", env.redlock[0].Addr(), env.redlock[1].Addr())

	clients, closeClients, err := d.openClients(2)
	defer closeClients()
	if err != nil {
		r.fail("redlock: %v", err)
		return
	}
	ok, overlaps := d.contend(ctx, clients)

	// A third node down: no majority, no lock.
	if !d.kill(2) {
		return
	}
	d.expectRefusal(ctx, clients[0])
	r.Summary = fmt.Sprintf("2 of 5 down: %d/%d cycles ok, 0 overlaps; 3 down: refused", ok, 2*rlCycles)
	if overlaps > 0 {
		r.Summary = fmt.Sprintf("2 of 5 down: %d overlaps", overlaps)
	}
}

// redlockDemo is the state of part (d): which nodes it killed.
type redlockDemo struct {
	env    *demoEnv
	r      *partResult
	killed []int // indexes in env.redlock
}

// kill kills node i; it returns false, with r failed, if it could not.
func (d *redlockDemo) kill(i int) bool {
	if err := d.env.redlock[i].Kill(); err != nil {
		d.r.fail("killing node %s: %v", d.env.redlock[i].Addr(), err)
		return false
	}
	d.killed = append(d.killed, i)
	return true
}

// restartKilled restarts (empty) every node the demo killed.
func (d *redlockDemo) restartKilled() {
	for _, i := range d.killed {
		if err := d.env.redlock[i].Restart(); err != nil {
			d.r.fail("restarting node %s: %v", d.env.redlock[i].Addr(), err)
		}
	}
}

// openClients returns n Redlock clients over every node, each with its own
// connections, and a function that closes all it opened (to call even on
// error).
func (d *redlockDemo) openClients(n int) (clients []*dlock.Client, closeClients func(), err error) {
	var closers []func()
	closeClients = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	for range n {
		nodes := d.env.redlockClients()
		closers = append(closers, func() { closeAll(nodes) })
		b, err := newRedlockBackend(nodes, rlNodeTimeout)
		if err != nil {
			return clients, closeClients, err
		}
		c := dlock.New(b, d.env.g.clientOptions(dlock.WithTTL(rlTTL))...)
		closers = append(closers, func() { c.Close() })
		clients = append(clients, c)
	}
	return clients, closeClients, nil
}

// contend has every client take and release the lock rlCycles times,
// reports the cycles, fences and overlaps, and returns the cycles that
// succeeded and the overlaps seen.
func (d *redlockDemo) contend(ctx context.Context, clients []*dlock.Client) (cycles, overlapsSeen int64) {
	r := d.r
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
	return ok.Load(), overlaps.Load()
}

// expectRefusal tries the lock with c once and fails r if it is granted.
func (d *redlockDemo) expectRefusal(ctx context.Context, c *dlock.Client) {
	tctx, tcancel := context.WithTimeout(ctx, 3*d.env.g.timeout)
	lease, err := c.TryAcquire(tctx, "demo:d:job")
	tcancel()
	if err == nil {
		_ = lease.Release(ctx)
		d.r.fail("with 3 of 5 nodes down the lock was still granted")
	} else {
		d.r.detail("with 2 of 5 nodes up: refused, as it must be (%s)", shortErr(err))
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
