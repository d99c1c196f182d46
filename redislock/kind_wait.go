package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
)

// waitPermit is Wait for a permit: it waits in the semaphore's permit
// queue (kind_queue.lua) until a release hands this waiter a permit, or
// takes one (kind_acquire.lua) when it is first in line and a permit is
// free. When ctx ends, the waiter leaves the queue (releasing a permit
// just handed to it, which passes it on) and the error matches ctx.Err();
// after Close it matches dlock.ErrClosed.
func (b *Backend) waitPermit(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := checkShared(&r); err != nil {
		return dlock.Grant{}, err
	}
	if err := b.hub.wakeReady(ctx); err != nil {
		if errors.Is(err, errClosed) {
			return dlock.Grant{}, errClosed
		}
		if ctx.Err() != nil {
			return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
		}
		// Without the wake channel the heartbeat steps still serve the
		// waiter, only later.
	}
	lock := b.lockName(r.Key)
	keys := sharedKeys(lock)
	pw := &permitWaiter{queued: *b.newQueued(r, lock, []string{lock, keys[1], keys[4]})}
	w := b.hub.route(pw.route)
	defer b.hub.unroute(pw.route, w)

	beat := b.cfg.waiterTTL / 4
	timer := time.NewTimer(beat)
	defer timer.Stop()
	for {
		if b.closed.Load() {
			pw.leave(ctx)
			return dlock.Grant{}, errClosed
		}
		g, turn, err := pw.step(ctx)
		if err == nil && !g.OK && turn {
			sent := time.Now()
			if g, _, err = b.tryShared(ctx, r, pw.member); err == nil && g.OK {
				g.Since = sent
			}
		}
		if err != nil {
			pw.leave(ctx)
			if ctx.Err() != nil {
				return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
			}
			return dlock.Grant{}, err
		}
		if g.OK {
			return g, nil
		}
		timer.Reset(beat)
		select {
		case <-ctx.Done():
			pw.leave(ctx)
			return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
		case <-w.ch:
			if g, ok := pw.handed(b.hub.takeHandoff(w)); ok {
				return g, nil
			}
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// permitWaiter is one waiter of waitPermit: a queued (its fields, and
// handed for a hand-off message) whose keys are the lock, the holds and
// the permit queue.
type permitWaiter struct {
	queued
}

// step runs kind_queue.lua once. It returns a permit a release handed to
// this waiter (confirmed now), or whether it is the waiter's turn to try.
// A step abandoned by ctx is undone by its own cleanup when its reply
// comes: a permit is released, a queue entry left.
func (pw *permitWaiter) step(ctx context.Context) (dlock.Grant, bool, error) {
	b, r := pw.b, pw.r
	args := []any{r.Token, b.ttlArg(r.TTL), pw.member, pw.seq, ttlArg(b.cfg.waiterTTL), strconv.Itoa(r.Permits)}
	run := func(ctx context.Context) (reply, error) {
		return b.eval(ctx, kindQueueScript, pw.keys, args...)
	}
	undone := make(chan struct{})
	late := func(v reply, err error) {
		defer close(undone)
		if g, _, _, _, perr := parseStep(v.v, err); perr == nil && g.OK {
			b.releaseSharedGrant(ctx, r, g.Fence)
		} else if err == nil {
			pw.exit(ctx)
		}
	}
	if err := ctx.Err(); err != nil {
		return dlock.Grant{}, false, b.callErr("wait", r.Key, err) // nothing sent
	}
	sent := time.Now()
	v, err := guard(b, ctx, false, run, late)
	if err != nil {
		if ctx.Err() != nil {
			// Sent and still running: wait (at most the waiter TTL) until it
			// is undone, so that the waiter has left the queue on return.
			t := time.NewTimer(b.cfg.waiterTTL)
			select {
			case <-undone:
			case <-t.C:
			}
			t.Stop()
		}
		return dlock.Grant{}, false, b.callErr("wait", r.Key, err)
	}
	// The reply has the shape of queue.lua's; its "head" is the turn.
	g, next, seq, deadline, err := parseStepTurn(v.v, r)
	if err != nil {
		return dlock.Grant{}, false, err
	}
	if g.OK {
		g.Since = sent
		if err := b.replicated("wait", r.Key, v); err != nil {
			b.releaseSharedGrant(ctx, r, g.Fence)
			return dlock.Grant{}, false, err
		}
		return g, false, nil
	}
	pw.seq, pw.sent, pw.deadline = seq, sent, deadline
	return g, next, nil
}

// parseStepTurn reads kind_queue.lua's reply to r's waiter: a grant, or
// the arrival, the heartbeat deadline and whether it is the waiter's turn.
func parseStepTurn(v any, r dlock.Request) (dlock.Grant, bool, string, int64, error) {
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return dlock.Grant{}, false, "", 0, unexpected("wait", v)
	}
	if a[0] != int64(codeHeld) {
		g, _, err := parseShared(v, nil, r)
		return g, false, "", 0, err
	}
	if len(a) != 5 {
		return dlock.Grant{}, false, "", 0, unexpected("wait", v)
	}
	seq, ok1 := a[2].(int64)
	turn, ok2 := a[3].(int64)
	deadline, ok3 := a[4].(int64)
	if !ok1 || !ok2 || !ok3 || seq <= 0 || deadline <= 0 {
		return dlock.Grant{}, false, "", 0, unexpected("wait", v)
	}
	return dlock.Grant{}, turn == 1, strconv.FormatInt(seq, 10), deadline, nil
}

// leave takes the waiter out of the permit queue when a step queued it
// (see queued.leave).
func (pw *permitWaiter) leave(ctx context.Context) {
	if pw.deadline != 0 {
		pw.exit(ctx)
	}
}

// exit runs kind_leave.lua for the waiter, and releases a permit a
// release handed to it meanwhile (which passes it on). It runs without
// ctx's cancellation, bounded by the waiter TTL.
func (pw *permitWaiter) exit(ctx context.Context) {
	b := pw.b
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.waiterTTL)
	defer cancel()
	fence, err := kindLeaveScript.Run(ctx, b.rdb, pw.keys, pw.r.Token, pw.member).Int64()
	if err == nil && fence > 0 {
		b.releaseSharedGrant(ctx, pw.r, uint64(fence))
	}
}
