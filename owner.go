package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/ctxend"
)

// ownerKey names the holds one WithOwner id has on one key in a Client.
type ownerKey struct{ key, owner string }

// holdGroup is the holds of one (key, owner) in a Client. They share one
// server hold: the first hold takes it, later ones join it without asking
// the server (or with one Refresh when they need a later deadline), and
// the release of the last live hold gives it back. gate serialises first
// acquisitions; the other fields are guarded by Client.mu.
type holdGroup struct {
	gate    chan struct{}
	waiting bool     // the gate's holder waits for a lock held elsewhere
	holds   []*Lease // holds not yet released: live, or lost
	users   int      // acquisitions using the group
}

// group returns the group of k, created when missing, and counts a user.
func (c *Client) group(k ownerKey) *holdGroup {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.owned[k]
	if g == nil {
		g = &holdGroup{gate: make(chan struct{}, 1)}
		c.owned[k] = g
	}
	g.users++
	return g
}

// ungroup drops a user of k's group, deleting the group when it is empty.
func (c *Client) ungroup(k ownerKey, g *holdGroup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g.users--
	c.dropEmptyLocked(k, g)
}

func (c *Client) dropEmptyLocked(k ownerKey, g *holdGroup) {
	if g.users == 0 && len(g.holds) == 0 && c.owned[k] == g {
		delete(c.owned, k)
	}
}

// setWaiting records whether the gate's holder is waiting for the lock.
func (c *Client) setWaiting(g *holdGroup, on bool) {
	if g == nil {
		return
	}
	c.mu.Lock()
	g.waiting = on
	c.mu.Unlock()
}

// liveLocked returns the group's live holds (not being released) and the
// cause of a hold lost but not yet released. c.mu must be held.
func (g *holdGroup) liveLocked() (live []*Lease, lost error) {
	for _, l := range g.holds {
		if err := l.Err(); err == nil {
			if !l.isReleasing() {
				live = append(live, l)
			}
		} else if lost == nil && errors.Is(err, ErrLost) {
			lost = err
		}
	}
	return live, lost
}

// acquireOwned takes key for a WithOwner id: it joins this Client's live
// hold of the same owner, or takes the lock on the server as the owner's
// first hold here. First acquisitions of one owner are serialised, so two
// goroutines sharing an owner id never both ask the server.
func (c *Client) acquireOwned(ctx context.Context, req Request, cfg config, once bool) (*Lease, error) {
	k := ownerKey{req.Key, req.Token}
	g := c.group(k)
	defer c.ungroup(k, g)
	if err := c.enterGate(ctx, g, req.Key, cfg, once); err != nil {
		return nil, err
	}
	defer func() { <-g.gate }()

	c.mu.Lock()
	_, lost := g.liveLocked()
	c.mu.Unlock()
	if lost != nil {
		// Re-entering would silently take a fresh lock inside a critical
		// section that was already compromised: report the loss until the
		// lost hold is released.
		return nil, wrapOp("acquire", req.Key, lost)
	}
	cfg.group = g
	if l, joined, err := c.rejoin(ctx, req, cfg, g); joined {
		return l, err
	}
	return c.acquireWait(ctx, req, cfg)
}

// enterGate takes g's gate. A TryAcquire that finds the owner's first
// acquisition waiting for a lock held elsewhere fails at once; Acquire
// waits for the gate within ctx and the strategy's patience.
func (c *Client) enterGate(ctx context.Context, g *holdGroup, key string, cfg config, once bool) error {
	select {
	case g.gate <- struct{}{}:
		return nil
	default:
	}
	if once {
		c.mu.Lock()
		waiting := g.waiting
		c.mu.Unlock()
		if waiting {
			return &AcquireError{Key: key, Attempts: 1}
		}
	}
	var bound <-chan time.Time
	if p, finite := patience(cfg.wait); finite && !once {
		t := time.NewTimer(p)
		defer t.Stop()
		bound = t.C
	}
	if len(cfg.observers) > 0 {
		observe(ctx, cfg.observers, Event{Kind: EventWaitStart, Key: key})
		defer observe(ctx, cfg.observers, Event{Kind: EventWaitEnd, Key: key})
	}
	select {
	case g.gate <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctxAcquireError(key, 1, ctx, nil)
	case <-c.closing:
		return wrapOp("acquire", key, ErrClosed)
	case <-bound:
		return &AcquireError{Key: key, Attempts: 1}
	}
}

// rejoin adds a hold to the owner's live holds, if there are any
// (joined reports whether it did). It asks the server only when the new
// hold's TTL reaches past every live hold's Expires: then one Refresh
// moves the server's deadline (never back) to cover it.
func (c *Client) rejoin(ctx context.Context, req Request, cfg config, g *holdGroup) (l *Lease, joined bool, err error) {
	invoke := time.Now()
	want := invoke.Add(req.TTL - drift(req.TTL))
	c.mu.Lock()
	live, _ := g.liveLocked()
	if len(live) == 0 {
		c.mu.Unlock()
		return nil, false, nil
	}
	if c.closed {
		c.mu.Unlock()
		return nil, true, wrapOp("acquire", req.Key, ErrClosed)
	}
	var maxExp time.Time
	count := 0
	for _, h := range live {
		if e := h.Expires(); e.After(maxExp) {
			maxExp = e
		}
		count = max(count, h.count)
	}
	req.Fence = live[0].req.Fence
	l = c.newLease(req, Grant{OK: true, Fence: req.Fence, Count: count + 1}, invoke, cfg)
	needRefresh := want.After(maxExp)
	if needRefresh {
		l.expires = maxExp // what the server is known to hold until the Refresh answers
		l.unannounced = true
	}
	// Registered in the same critical section as the check above, and
	// before the Refresh: a concurrent release of the other holds sees
	// this one live and leaves the server hold in place.
	c.leases[l] = struct{}{}
	g.holds = append(g.holds, l)
	c.mu.Unlock()
	// Watched before the Refresh: a backend that counts the watchers of a
	// hold must not see none left while this one joins it.
	c.watchLoss(l)

	if needRefresh {
		err := c.b.Refresh(ctx, req)
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.releaseTimeout)
			defer cancel()
			switch {
			case errors.Is(err, ErrNotHeld):
				l.lose(err) // and every hold of the same grant (l unreported)
				_ = l.releaseLocked(rctx)
				return nil, true, wrapOp("acquire", req.Key, l.Err())
			default:
				_ = l.releaseLocked(rctx) // the gate is ours
				if ctxend.Ended(ctx) {
					return nil, true, ctxAcquireError(req.Key, 1, ctx, err)
				}
				return nil, true, wrapOp("acquire", req.Key, err)
			}
		}
		l.mu.Lock()
		l.expires = want
		lost := l.err != nil
		l.unannounced = false
		l.mu.Unlock()
		if lost {
			// Lost (unreported) while the Refresh was on its way.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.releaseTimeout)
			defer cancel()
			_ = l.releaseLocked(rctx)
			return nil, true, wrapOp("acquire", req.Key, l.Err())
		}
	}
	c.mu.Lock()
	if l.Err() == nil { // not released meanwhile by Close
		c.track(l)
	}
	c.mu.Unlock()
	l.limitHold()
	return l, true, nil
}

// leaveGroup removes a released hold from its owner's group and reports
// whether the server hold must be given back: no other live hold of the
// group remains. Leases without an owner always give it back.
func (c *Client) leaveGroup(l *Lease) (last bool) {
	if !l.req.Reentrant {
		return true
	}
	k := ownerKey{l.req.Key, l.req.Token}
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.owned[k]
	if g == nil {
		return true
	}
	last = true
	for i := 0; i < len(g.holds); i++ {
		h := g.holds[i]
		if h == l {
			g.holds = append(g.holds[:i], g.holds[i+1:]...)
			i--
			continue
		}
		if h.req.Fence == l.req.Fence && h.Err() == nil {
			last = false
		}
	}
	c.dropEmptyLocked(k, g)
	return last
}

// lockGroup serialises l's release with the other releases and the
// acquisitions of its owner in this Client (the group's gate), and
// returns the function that unlocks it. Leases without an owner need no
// lock. It fails with ctx's error when ctx ends first.
func (c *Client) lockGroup(ctx context.Context, l *Lease) (unlock func(), err error) {
	if !l.req.Reentrant {
		return func() {}, nil
	}
	k := ownerKey{l.req.Key, l.req.Token}
	g := c.group(k)
	select {
	case g.gate <- struct{}{}:
	case <-ctx.Done():
		c.ungroup(k, g)
		return nil, ctx.Err()
	}
	return func() {
		<-g.gate
		c.ungroup(k, g)
	}, nil
}

// siblings returns the other holds of l's grant in this Client.
func (c *Client) siblings(l *Lease) []*Lease {
	if !l.req.Reentrant {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.owned[ownerKey{l.req.Key, l.req.Token}]
	if g == nil {
		return nil
	}
	var out []*Lease
	for _, h := range g.holds {
		if h != l && h.req.Fence == l.req.Fence {
			out = append(out, h)
		}
	}
	return out
}

// ctxAcquireError is the error of a wait that ctx ended: it matches
// ErrNotAcquired, ctx.Err() and context.Cause(ctx).
func ctxAcquireError(key string, attempts int, ctx context.Context, last error) *AcquireError {
	err, cause := ctx.Err(), context.Cause(ctx)
	if err == nil {
		// The deadline passed and the server said so before the
		// context's own timer fired.
		err, cause = context.DeadlineExceeded, context.DeadlineExceeded
	}
	return &AcquireError{Key: key, Attempts: attempts, Cause: cause, Last: last, ctxErr: err}
}

// effectiveTTL is cfg's TTL: the backend's maximum when it is lower and
// no TTL was set, checked against the backend's minimum.
func (c *Client) effectiveTTL(cfg *config) error {
	if c.limiter != nil && !cfg.ttlSet {
		if m := c.limiter.MaxTTL(); m >= MinTTL && m < cfg.ttl {
			cfg.ttl = m
		}
	}
	return c.checkFloor(cfg.ttl)
}

// checkFloor refuses a TTL below the backend's minimum (TTLFloor).
func (c *Client) checkFloor(ttl time.Duration) error {
	if c.floor != nil {
		if m := c.floor.MinTTL(); ttl < m {
			return fmt.Errorf("%w: TTL %v is below the minimum %v of backend %T (its renewals every TTL/3 need a round trip)", ErrInvalidTTL, ttl, m, c.b)
		}
	}
	return nil
}
