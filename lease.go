package dlock

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// A Lease is one hold of a lock, returned by Acquire, TryAcquire and Do.
// All methods are safe for concurrent use. Accessors never make a network
// call; Refresh and Release do.
//
// A lease ends exactly once: by Release (Err then returns ErrReleased), or
// by loss (Err then returns an error matching ErrLost). Done closes and
// every Context derived from the lease is cancelled when it ends.
type Lease struct {
	c       *Client
	req     Request // Key, Token, Reentrant, FIFO, Fence; TTL is guarded by mu
	count   int
	created time.Time
	valid   time.Duration // the lock's lifetime from created: the TTL, or a shorter Grant.TTL

	mu             sync.Mutex
	ttl            time.Duration
	expires        time.Time
	err            error // nil while held
	releasing      bool
	unannounced    bool // a re-entry not yet returned: a loss ends it unreported
	done           chan struct{}
	cancels        map[uint64]context.CancelCauseFunc
	nextID         uint64
	stopLoss       func()
	onLost         func(*Lease, error)
	observers      []Observer
	releaseTimeout time.Duration // bounds the release Do performs
	minHold        time.Duration // WithMinHold
	maxHold        time.Duration // WithMaxHold
	maxTimer       *time.Timer   // ends the lease at created + maxHold

	// watchdog bookkeeping, guarded by c.mu
	autoRenew bool
	next      time.Time // next renewal (autoRenew) — in c.renew
	expAt     time.Time // expiry (!autoRenew) — in c.expiry
	renewIdx  int       // index in c.renew, -1 when absent
	expIdx    int       // index in c.expiry, -1 when absent
}

// Key returns the lock's key as given to Acquire.
func (l *Lease) Key() string { return l.req.Key }

// Owner returns the owner token: the WithOwner id, or the random token
// generated for this lease.
func (l *Lease) Owner() string { return l.req.Token }

// Fence returns the fencing token: strictly greater than the fence of any
// earlier grant of the same key (nested reentrant acquisitions share their
// fence). Pass it to the resource you protect and have the resource reject
// a write whose fence is lower than one it has seen (package fence).
func (l *Lease) Fence() uint64 { return l.req.Fence }

// Kind returns what the lease holds: KindLock, KindPermit or KindRead.
func (l *Lease) Kind() Kind { return l.req.Kind }

// Count returns the reentrant hold count when this lease was granted: 1
// for a first acquisition, n for the n-th nested one.
func (l *Lease) Count() int { return l.count }

// TTL returns the lifetime the lease is renewed to.
func (l *Lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// Expires returns a conservative local deadline of the lease: the invoke
// time of the last successful acquire or renewal plus TTL minus the
// allowed clock drift (TTL/100 + min(2ms, TTL/4)). The server holds the
// lock at least until then, unless something outside dlock deletes it.
//
// After a queue hand-off that reserved the lock for a shorter time
// (Grant.TTL) it is the reservation's end until the first renewal
// confirms the lease with its full TTL.
func (l *Lease) Expires() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

// Done returns a channel that is closed when the lease ends, by Release
// or by loss. Err tells which.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns nil while the lease is held, an error matching ErrReleased
// after Release, or an error matching ErrLost once the lease was lost.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context returns a copy of parent that is cancelled when the lease ends;
// after a loss context.Cause returns an error matching ErrLost, after a
// release one matching ErrReleased. Call cancel when the work is done to
// free the registration. Context starts no goroutine.
func (l *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	l.mu.Lock()
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		cancel(err)
		return ctx, func() { cancel(context.Canceled) }
	}
	id := l.nextID
	l.nextID++
	if l.cancels == nil {
		l.cancels = make(map[uint64]context.CancelCauseFunc)
	}
	l.cancels[id] = cancel
	l.mu.Unlock()
	return ctx, func() {
		l.mu.Lock()
		delete(l.cancels, id)
		l.mu.Unlock()
		cancel(context.Canceled)
	}
}

// Refresh extends the lease to at least ttl from now (ttl 0 means the
// lease's current TTL) and makes ttl the lease's TTL for later renewals.
// A lock's deadline never moves back: a shorter ttl shortens only the
// renewal period, and Expires becomes the later of its current value and
// now + ttl − drift. It returns an error matching ErrReleased or ErrLost
// if the lease already ended, and one matching ErrNotHeld (the lease is
// then lost) if the server no longer holds it for this owner. On any other
// error (the server did not answer) the lease is unchanged.
func (l *Lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if l == nil {
		return fmt.Errorf("%w: refresh of a nil Lease", ErrInvalidOption)
	}
	if ctx == nil {
		return wrapOp("refresh", l.req.Key, fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	l.mu.Lock()
	if ttl == 0 {
		ttl = l.ttl
	}
	err := l.err
	l.mu.Unlock()
	if ttl < MinTTL {
		return wrapOp("refresh", l.req.Key, fmt.Errorf("%w: %v is below the minimum %v", ErrInvalidTTL, ttl, MinTTL))
	}
	if ferr := l.c.checkFloor(ttl); ferr != nil {
		return wrapOp("refresh", l.req.Key, ferr)
	}
	if err != nil {
		return wrapOp("refresh", l.req.Key, err)
	}
	r := l.req
	r.TTL = ttl
	invoke := time.Now()
	err = l.c.b.Refresh(ctx, r)
	switch {
	case errors.Is(err, ErrNotHeld):
		l.lose(err)
		return wrapOp("refresh", l.req.Key, err)
	case err != nil:
		return wrapOp("refresh", l.req.Key, err)
	}
	exp := invoke.Add(ttl - drift(ttl))
	l.c.mu.Lock()
	l.mu.Lock()
	if l.err == nil {
		l.ttl = ttl
		if exp.After(l.expires) {
			l.expires = exp
		}
		if l.expIdx >= 0 {
			l.expAt = l.expires
			heap.Fix(&l.c.expiry, l.expIdx)
		}
		if next := invoke.Add(ttl / 3); l.renewIdx >= 0 && next.Before(l.next) {
			// A shorter TTL renews sooner from now on.
			l.next = next
			heap.Fix(&l.c.renew, l.renewIdx)
		}
		l.c.scheduleLocked()
	}
	l.mu.Unlock()
	l.c.mu.Unlock()
	return nil
}

// Release gives the lock up (one hold of it, for a reentrant lease) and
// ends the lease: Done closes and its contexts are cancelled. It returns
// nil, or an error matching ErrReleased (already released), ErrLost (the
// lease had been lost), ErrNotHeld (the server no longer held it for
// this owner) or ErrMinHold (see WithMinHold). On a network error the
// lease still ends and the lock expires by itself by Expires; the lock of
// a lost lease is given back in the background.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil {
		return fmt.Errorf("%w: release of a nil Lease", ErrInvalidOption)
	}
	if len(l.observers) == 0 || ctx == nil {
		return l.release(ctx)
	}
	ctx = observe(ctx, l.observers, Event{Kind: EventReleaseStart, Key: l.req.Key, Lease: l})
	err := l.release(ctx)
	observe(ctx, l.observers, Event{Kind: EventReleased, Key: l.req.Key, Lease: l, Err: err, Duration: time.Since(l.created)})
	return err
}

func (l *Lease) release(ctx context.Context) error {
	if ctx == nil {
		return wrapOp("release", l.req.Key, fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	// The holds of one owner leave the group one at a time, and never
	// while a re-entry is being decided: exactly one of them gives the
	// server hold back.
	unlock, err := l.c.lockGroup(ctx, l)
	if err != nil {
		return wrapOp("release", l.req.Key, err)
	}
	defer unlock()
	return l.releaseLocked(ctx)
}

// releaseLocked is release with l's owner group locked (lockGroup).
func (l *Lease) releaseLocked(ctx context.Context) error {
	l.mu.Lock()
	if l.releasing {
		l.mu.Unlock()
		return wrapOp("release", l.req.Key, ErrReleased)
	}
	l.releasing = true
	lostErr := l.err
	l.mu.Unlock()

	// Other live holds of the same owner in this Client keep the server
	// hold; only the last one gives it back.
	last := l.c.leaveGroup(l)
	if lostErr != nil {
		// Lost while we held it. Clean up on the server in case the loss was
		// local only (a renewal's answer lost), in the background: the
		// caller learns of the loss at once, even from a server that does
		// not answer. The token and fence comparison makes this harmless if
		// someone else holds the lock now. A LossNotifier backend gave the
		// hold up when the last registration of the grant stopped, as the
		// loss ended it: a second give-back could take another Client's
		// share of an owner's hold.
		if last && !errors.Is(lostErr, ErrNotHeld) && !errors.Is(lostErr, ErrMaxHold) && l.c.loss == nil {
			l.c.releaseAt(l.request(), time.Now(), l.releaseTimeout, nil)
		}
		l.c.forget(l)
		return wrapOp("release", l.req.Key, lostErr)
	}
	if !last {
		l.end(ErrReleased, false)
		return nil
	}
	if until := l.created.Add(l.minHold); l.minHold > 0 && time.Now().Before(until) {
		return l.releaseLater(ctx, until)
	}
	err := l.c.b.Release(ctx, l.request())
	if errors.Is(err, ErrNotHeld) {
		l.end(fmt.Errorf("%w: %w", ErrLost, err), true)
		return wrapOp("release", l.req.Key, err)
	}
	l.end(ErrReleased, false)
	return wrapOp("release", l.req.Key, err)
}

// closeRelease ends l for Client.Close, then gives the lock back: the
// lease's Done closes and its contexts are cancelled (cause ErrReleased
// and ErrClosed) before the server frees the lock, so no one else holds
// it while l still looks valid. A lock in its minimum hold is left to
// expire by itself.
func (l *Lease) closeRelease(ctx context.Context) error {
	unlock, err := l.c.lockGroup(ctx, l)
	if err != nil {
		return wrapOp("release", l.req.Key, err)
	}
	defer unlock()
	l.mu.Lock()
	if l.releasing {
		l.mu.Unlock()
		return nil
	}
	l.releasing = true
	lostErr := l.err
	l.mu.Unlock()
	if lostErr != nil || len(l.observers) == 0 {
		return l.closeGiveBack(ctx, lostErr)
	}
	// A live lease ends here as by Release: observers see the release.
	ctx = observe(ctx, l.observers, Event{Kind: EventReleaseStart, Key: l.req.Key, Lease: l})
	err = l.closeGiveBack(ctx, nil)
	observe(ctx, l.observers, Event{Kind: EventReleased, Key: l.req.Key, Lease: l, Err: err, Duration: time.Since(l.created)})
	return err
}

// closeGiveBack is closeRelease once l is marked releasing; lostErr is the
// cause l was lost with, if it was.
func (l *Lease) closeGiveBack(ctx context.Context, lostErr error) error {
	last := l.c.leaveGroup(l)
	stop := l.keepLossWatch() // stopped once the lock is given back
	defer stop()
	if lostErr != nil {
		l.c.forget(l)
	} else {
		l.end(fmt.Errorf("%w: %w", ErrReleased, ErrClosed), false)
	}
	if !last || errors.Is(lostErr, ErrNotHeld) || errors.Is(lostErr, ErrMaxHold) || (lostErr != nil && l.c.loss != nil) {
		return nil
	}
	r := l.request()
	if until := l.created.Add(l.minHold); l.minHold > 0 && time.Now().Before(until) {
		if err := l.holdUntil(ctx, &r, until); err != nil && !errors.Is(err, ErrNotHeld) {
			return wrapOp("release", l.req.Key, err)
		}
		return nil
	}
	if err := l.c.b.Release(ctx, r); err != nil && !errors.Is(err, ErrNotHeld) {
		return wrapOp("release", l.req.Key, err)
	}
	return nil
}

// releaseLater ends the lease now and gives the lock back at until (the
// end of its minimum hold), first making sure the server keeps it that
// long.
func (l *Lease) releaseLater(ctx context.Context, until time.Time) error {
	r := l.request()
	err := l.holdUntil(ctx, &r, until)
	if errors.Is(err, ErrNotHeld) {
		l.end(fmt.Errorf("%w: %w", ErrLost, err), true)
		return wrapOp("release", l.req.Key, err)
	}
	stop := l.keepLossWatch() // stopped once the lock is given back
	l.end(ErrReleased, false)
	l.c.releaseAt(r, until, l.releaseTimeout, stop)
	return wrapOp("release", l.req.Key, err)
}

// holdUntil makes the server keep l's lock until at least until, setting
// r.TTL to what that takes. A failed extension is retried, as the
// watchdog retries a renewal, until it succeeds, the server answers
// ErrNotHeld, ctx ends or the lock's current expiry nears. It returns
// nil, or an error matching ErrNotHeld, or ErrMinHold wrapping the last
// failure: the lock is then freed at its current expiry, before until.
func (l *Lease) holdUntil(ctx context.Context, r *Request, until time.Time) error {
	expires := l.Expires()
	if !expires.Before(until) {
		return nil
	}
	// Give up a little before the expiry, so that the lease ends as
	// released rather than as expired.
	ctx, cancel := context.WithDeadline(ctx, expires.Add(-time.Until(expires)/10))
	defer cancel()
	for {
		left := time.Until(until)
		ttl := left + drift(left)
		if ttl < left {
			ttl = math.MaxInt64 // saturate: an endless hold
		}
		r.TTL = max(ttl, MinTTL)
		if l.c.floor != nil {
			r.TTL = max(r.TTL, l.c.floor.MinTTL())
		}
		err := l.c.b.Refresh(ctx, *r)
		if err == nil || errors.Is(err, ErrNotHeld) {
			return err
		}
		t := time.NewTimer(retryAfter(l.TTL(), time.Until(expires)))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: not extended to its end: %w", ErrMinHold, err)
		case <-t.C:
		}
	}
}

// hitMaxHold ends the lease at the end of its maximum hold and gives the
// lock back unless another live hold of the grant remains in the Client.
func (l *Lease) hitMaxHold() {
	stop := l.keepLossWatch() // stopped once the lock is given back
	defer stop()
	if !l.end(fmt.Errorf("%w: %w", ErrLost, ErrMaxHold), true) {
		return
	}
	gctx, cancel := context.WithTimeout(l.c.closeCtx, l.releaseTimeout)
	defer cancel()
	unlock, err := l.c.lockGroup(gctx, l)
	if err != nil {
		return // the lock expires by itself
	}
	defer unlock()
	for _, s := range l.c.siblings(l) {
		if s.Err() == nil {
			return
		}
	}
	c := l.c
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return // Close releases what is left
	}
	c.batches.Add(1)
	c.mu.Unlock()
	defer c.batches.Done()
	ctx, cancel := context.WithTimeout(c.closeCtx, l.releaseTimeout)
	defer cancel()
	c.untilClose(func() { _ = l.c.b.Release(ctx, l.request()) })
}

// keepLossWatch takes l's loss registration (LossNotifier) out of l, so
// that ending l does not stop it, and returns the function that stops it.
// A backend may give up a hold whose last registration stops while it is
// not being released: the caller that gives the lock back itself stops
// the registration only afterwards, so the hold is given back once.
func (l *Lease) keepLossWatch() (stop func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	stop = l.stopLoss
	l.stopLoss = nil
	if stop == nil {
		stop = func() {}
	}
	return stop
}

func (l *Lease) isReleasing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.releasing
}

func (l *Lease) request() Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.req
	r.TTL = l.ttl
	return r
}

// lose ends the lease as lost with cause, reported by the server (the
// lock is gone or another owner's): the other holds of the same grant in
// this Client are lost with it.
func (l *Lease) lose(cause error) {
	if !errors.Is(cause, ErrLost) {
		cause = fmt.Errorf("%w: %w", ErrLost, cause)
	}
	if l.end(cause, true) {
		for _, s := range l.c.siblings(l) {
			s.end(cause, true)
		}
	}
}

// expire ends the lease as lost because its validity ran out locally
// (unrenewed, or renewals failing): other holds of the grant keep theirs.
func (l *Lease) expire(cause error) {
	l.end(fmt.Errorf("%w: %w", ErrLost, cause), true)
}

// end ends the lease once with err and reports whether it did; later
// calls do nothing. Observers hear of a loss before Done closes, so a log
// line precedes the wake-up, and the lease's contexts are cancelled
// before Done closes.
func (l *Lease) end(err error, lost bool) bool {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return false
	}
	l.err = err
	cancels := l.cancels
	l.cancels = nil
	stop := l.stopLoss
	l.stopLoss = nil
	maxTimer := l.maxTimer
	if l.unannounced {
		lost = false // the caller gets an error, not this lease
	}
	l.mu.Unlock()

	if stop != nil {
		stop()
	}
	if maxTimer != nil {
		maxTimer.Stop()
	}
	l.c.forget(l)
	if lost {
		observe(context.Background(), l.observers, Event{Kind: EventLost, Key: l.req.Key, Lease: l, Err: err, Duration: time.Since(l.created)})
		if l.onLost != nil {
			go l.onLost(l, err)
		}
	}
	// The contexts first: whoever wakes on Done finds them cancelled, with
	// the cause, already.
	for _, cancel := range cancels {
		cancel(err)
	}
	close(l.done)
	return true
}

// Drift returns the clock drift Expires allows for a lease of ttl:
// TTL/100 + min(2ms, TTL/4).
func Drift(ttl time.Duration) time.Duration { return drift(ttl) }

func drift(ttl time.Duration) time.Duration {
	return ttl/100 + min(2*time.Millisecond, ttl/4)
}
