package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Wait implements dlock.Waiter: it waits in the lock's server-side FIFO
// queue until a release hands the lock to this waiter, or takes it at once
// when it is free and nobody is queued (permits and read holds: package
// documentation). When ctx ends, the waiter leaves the queue (passing on
// a lock just handed to it) and the error matches ctx.Err(); after Close
// it matches dlock.ErrClosed.
func (b *Backend) Wait(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := b.check(ctx, &r, true); err != nil {
		return dlock.Grant{}, err
	}
	switch r.Kind {
	case dlock.KindPermit:
		return b.waitPermit(ctx, r)
	case dlock.KindRead:
		return b.waitShared(ctx, r)
	}
	g, err := b.waitLock(ctx, r)
	if err != nil && r.Waiting {
		// Without ctx's cancellation, bounded like leaving the queue.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.waiterTTL)
		_ = b.withdrawWriter(wctx, r)
		cancel()
	}
	if err == nil {
		b.grantedWriter(b.lockName(r.Key), r)
		err = b.grantValue(ctx, r, g)
	}
	return g, err
}

// waitLock is Wait for a lock.
func (b *Backend) waitLock(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	lock := b.lockName(r.Key)
	q := b.newQueued(r, lock, lockKeys(lock))
	return b.waitQueued(ctx, r, q.route, q)
}

// queueWaiter is one waiter of a server-side queue, driven by waitQueued.
type queueWaiter interface {
	// step runs the queue script once. It returns a grant or, while
	// queued, how soon to step again at the latest (0: the next heartbeat).
	step(ctx context.Context) (dlock.Grant, time.Duration, error)
	// handed returns the grant a hand-off message gives the waiter at once.
	handed(ho handoff) (dlock.Grant, bool)
	// leave takes the waiter out of the queue when a step queued it.
	leave(ctx context.Context)
}

// waitQueued is the wait of r's waiter w, whose wake messages carry route:
// it steps w every heartbeat, sooner when a step says so, and takes its
// hand-off messages until it is granted. When ctx ends, or the Backend is
// closed, w leaves the queue and the error matches ctx.Err() or
// dlock.ErrClosed.
func (b *Backend) waitQueued(ctx context.Context, r dlock.Request, route string, w queueWaiter) (dlock.Grant, error) {
	if err := b.hub.wakeReady(ctx); err != nil {
		if errors.Is(err, errClosed) {
			return dlock.Grant{}, errClosed
		}
		if ctx.Err() != nil {
			return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
		}
		// Without the wake channel the waiter's heartbeat steps still
		// serve it, only later. The steps report the server's errors.
	}
	wk := b.hub.route(route)
	defer b.hub.unroute(route, wk)

	beat := b.cfg.waiterTTL / 4
	timer := time.NewTimer(beat)
	defer timer.Stop()
	for {
		if b.closed.Load() {
			w.leave(ctx)
			return dlock.Grant{}, errClosed
		}
		g, next, err := w.step(ctx)
		if err != nil {
			w.leave(ctx)
			if ctx.Err() != nil {
				return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
			}
			return dlock.Grant{}, err
		}
		if g.OK {
			return g, nil
		}
		// Wait for the hand-off message, the next heartbeat, or (first in
		// line) the holder's expiry, whichever comes first.
		d := beat
		if next > 0 {
			d = min(d, next)
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			w.leave(ctx)
			return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
		case <-wk.ch:
			if g, ok := w.handed(b.hub.takeHandoff(wk)); ok {
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

// queued is one waiter of Wait.
type queued struct {
	b      *Backend
	r      dlock.Request
	keys   []string
	member string // the queue member: Backend id + token
	route  string // the wake message payload for this waiter
	seq    string // the arrival (server µs), "0" before the waiter is queued

	// The last step that left the waiter queued: its invoke time and the
	// heartbeat deadline it set (server ms), 0 before the first.
	sent     time.Time
	deadline int64
	// unsure: a step failed after it may have run (its reply lost), so
	// the waiter may be queued although no step said so.
	unsure bool
}

// newQueued returns the queue wait of r on lock, whose scripts take keys.
func (b *Backend) newQueued(r dlock.Request, lock string, keys []string) *queued {
	return &queued{
		b:      b,
		r:      r,
		keys:   keys,
		member: b.id + r.Token,
		route:  strconv.Itoa(len(lock)) + ":" + lock + r.Token,
		seq:    "0",
	}
}

// handed returns the grant a hand-off message gives this waiter at once,
// confirmed later by the lease's first renewal or its release. It refuses
// (the next step confirms instead) a reentrant request (its count must be
// exact), WithReplicas (the step is what WAIT confirms), a message that
// names an older step, and one that came after half the reservation.
func (q *queued) handed(ho handoff) (dlock.Grant, bool) {
	if !ho.ok || q.r.Reentrant || q.b.cfg.replicas > 0 || q.deadline == 0 || ho.deadline != q.deadline {
		return dlock.Grant{}, false
	}
	if time.Since(q.sent) >= min(ho.claim, q.r.TTL)/2 {
		return dlock.Grant{}, false
	}
	return dlock.Grant{OK: true, Fence: ho.fence, Count: 1, Since: q.sent, TTL: ho.claim}, true
}

// step runs queue.lua once. It returns the grant, or, while queued, how
// soon the lock may free itself when this waiter is first in line (0 when
// unknown or not first).
func (q *queued) step(ctx context.Context) (dlock.Grant, time.Duration, error) {
	b, r := q.b, q.r
	args := []any{r.Token, b.ttlArg(r.TTL), reentrantArg(r.Reentrant), q.member, q.seq,
		ttlArg(b.cfg.waiterTTL), b.claimArg(), b.wakePrefix()}
	var next time.Duration
	g, err := q.send(ctx, queueScript, args, b.releaseGrant, q.exit, func(v any) (g dlock.Grant, seq string, deadline int64, err error) {
		g, next, seq, deadline, err = parseStep(v, nil)
		return g, seq, deadline, err
	})
	return g, next, err
}

// send runs one step of the waiter's queue script s with args and reads
// its reply with parse: a grant, or the arrival and heartbeat deadline of
// the waiter still queued. A grant counts from the step's invoke; one that
// WithReplicas does not confirm is given back with release. A step that
// ctx ended while it ran is undone by its own cleanup when its reply comes
// (a grant given back with release, a queue entry left with exit), and
// send waits for that (at most the waiter TTL) so that the waiter has left
// the queue when Wait returns, as dlock.Waiter says. A step that failed
// returns at once, and waitQueued leaves the queue (also when that step
// may have queued the waiter: its reply lost).
func (q *queued) send(ctx context.Context, s *redis.Script, args []any,
	release func(context.Context, dlock.Request, uint64), exit func(context.Context),
	parse func(any) (dlock.Grant, string, int64, error)) (dlock.Grant, error) {
	b, r := q.b, q.r
	call := func(ctx context.Context) (reply, error) {
		return b.eval(ctx, s, q.keys, args...)
	}
	undone := make(chan struct{})
	late := func(v reply, err error) {
		defer close(undone)
		if g, _, _, _, perr := parseStep(v.v, err); perr == nil && g.OK {
			release(ctx, r, g.Fence)
		} else if err == nil {
			exit(ctx)
		}
	}
	if err := ctx.Err(); err != nil {
		return dlock.Grant{}, b.callErr("wait", r.Key, err) // nothing sent
	}
	sent := time.Now()
	v, gaveUp, err := guardLate(b, ctx, learn, call, late)
	if err != nil {
		var rerr redis.Error
		if !gaveUp && !errors.As(err, &rerr) {
			q.unsure = true // not the server's error reply: it may have run
		}
		if gaveUp {
			// Only a step given up while it ran is undone by late; one that
			// failed, or was never sent, has nothing to undo.
			t := time.NewTimer(b.cfg.waiterTTL)
			select {
			case <-undone:
			case <-t.C:
			}
			t.Stop()
		}
		return dlock.Grant{}, b.callErr("wait", r.Key, err)
	}
	g, seq, deadline, err := parse(v.v)
	if err != nil {
		return dlock.Grant{}, err
	}
	if g.OK {
		// This step set the lock's TTL (a claim, a re-entry or a grant):
		// the lease's validity counts from its invoke.
		g.Since = sent
		if err := b.replicated("wait", r.Key, v); err != nil {
			release(ctx, r, g.Fence)
			return dlock.Grant{}, err
		}
		return g, nil
	}
	q.seq, q.sent, q.deadline = seq, sent, deadline
	return g, nil
}

// parseStep reads queue.lua's reply: a grant, or the time until the lock
// may free itself (when first in line), the arrival number and the new
// heartbeat deadline.
func parseStep(v any, err error) (dlock.Grant, time.Duration, string, int64, error) {
	if err != nil {
		return dlock.Grant{}, 0, "", 0, err
	}
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return dlock.Grant{}, 0, "", 0, unexpected("wait", v)
	}
	if a[0] != int64(codeHeld) {
		g, err := parseGrant(v, nil)
		return g, 0, "", 0, err
	}
	if len(a) != 5 {
		return dlock.Grant{}, 0, "", 0, unexpected("wait", v)
	}
	pttl, ok1 := a[1].(int64)
	seq, ok2 := a[2].(int64)
	head, ok3 := a[3].(int64)
	deadline, ok4 := a[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || seq <= 0 || deadline <= 0 {
		return dlock.Grant{}, 0, "", 0, unexpected("wait", v)
	}
	var next time.Duration
	if head == 1 && pttl >= 0 {
		// Just past the expiry: PTTL rounds down.
		next = time.Duration(pttl+1) * time.Millisecond
	}
	return dlock.Grant{}, next, strconv.FormatInt(seq, 10), deadline, nil
}

// leave takes the waiter out of the queue (and passes on a lock handed to
// it but not confirmed) when a step queued it, without ctx's cancellation,
// bounded by the waiter TTL: a waiter that could not leave is dropped
// when its heartbeat lapses. It runs even after Close: the go-redis client
// is the caller's and still open.
func (q *queued) leave(ctx context.Context) {
	if q.deadline != 0 || q.unsure {
		q.exit(ctx) // else never queued; an abandoned step leaves by itself (see send)
	}
}

// exit runs leave.lua for the waiter (see leave).
func (q *queued) exit(ctx context.Context) {
	b := q.b
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.waiterTTL)
	defer cancel()
	lock := q.keys[0]
	leaveScript.Run(ctx, b.rdb, q.keys, q.r.Token, q.member, channelName(lock), b.claimArg(), b.wakePrefix())
}
