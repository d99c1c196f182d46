package redislock

import (
	"context"
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
	lock := b.lockName(r.Key)
	keys := sharedKeys(lock)
	pw := &permitWaiter{queued: *b.newQueued(r, lock, []string{lock, keys[1], keys[4]})}
	return b.waitQueued(ctx, r, pw.route, pw)
}

// permitWaiter is one waiter of waitPermit: a queued (its fields, and
// handed for a hand-off message) whose keys are the lock, the holds and
// the permit queue.
type permitWaiter struct {
	queued
}

// step runs kind_queue.lua once and, when it is the waiter's turn,
// kind_acquire.lua. It returns a permit a release handed to this waiter
// (confirmed now) or took, and never a time to step again sooner.
func (pw *permitWaiter) step(ctx context.Context) (dlock.Grant, time.Duration, error) {
	b, r := pw.b, pw.r
	args := []any{r.Token, b.ttlArg(r.TTL), pw.member, pw.seq, ttlArg(b.cfg.waiterTTL), strconv.Itoa(r.Permits)}
	var turn bool
	// The reply has the shape of queue.lua's; its "head" is the turn.
	g, err := pw.send(ctx, kindQueueScript, args, b.releaseSharedGrant, pw.exit, func(v any) (g dlock.Grant, seq string, deadline int64, err error) {
		g, turn, seq, deadline, err = parseStepTurn(v, r)
		return g, seq, deadline, err
	})
	if err == nil && !g.OK && turn {
		sent := time.Now()
		if g, _, err = b.tryShared(ctx, r, pw.member); err == nil && g.OK {
			g.Since = sent
		}
	}
	return g, 0, err
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
	if pw.deadline != 0 || pw.unsure {
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
