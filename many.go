package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dlock-go/dlock/internal/ctxend"
)

// MultiAcquirer is an optional Backend capability: take several locks in
// one step, all or none (for example keys of one cluster slot in one
// script).
type MultiAcquirer interface {
	// Groups splits sorted keys into consecutive runs that TryAcquireAll
	// can take in one step. Every key appears in exactly one group, in
	// order.
	Groups(keys []string) [][]string

	// TryAcquireAll makes one attempt to take every request's lock. Either
	// all are taken (every Grant OK), or none is held afterwards and the
	// grants that lost carry OK false (with HolderTTL when known).
	TryAcquireAll(ctx context.Context, rs []Request) ([]Grant, error)
}

// AcquireMany takes every key or none, in sorted order (groups the backend
// can take atomically in one step), so callers with overlapping key sets
// never deadlock. It returns the leases in the order of keys, each with
// its own fence; on failure it releases what it took (within the release
// timeout) and returns the failing key's error. No keys, an invalid key or
// a key given twice is an ErrInvalidKey error. See the package overview
// for waits, FIFO and owners.
func (c *Client) AcquireMany(ctx context.Context, keys []string, opts ...Option) ([]*Lease, error) {
	if err := c.usable(); err != nil {
		return nil, wrapOp("acquire", fmt.Sprint(keys), err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, wrapOp("acquire", fmt.Sprint(keys), ErrClosed)
	}
	c.acquiring.Add(1)
	c.mu.Unlock()
	defer c.acquiring.Done()
	sorted, cfg, err := c.manyRequest(ctx, keys, opts)
	if err != nil {
		return nil, err
	}

	var groups [][]string
	multi, _ := c.b.(MultiAcquirer)
	if multi != nil && cfg.owner == "" {
		groups = multi.Groups(sorted)
	} else {
		for _, k := range sorted {
			groups = append(groups, []string{k})
		}
	}
	held := make(map[string]*Lease, len(keys))
	fail := func(err error) ([]*Lease, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.releaseTimeout)
		defer cancel()
		for _, l := range held {
			_ = l.Release(rctx)
		}
		return nil, err
	}
	for _, g := range groups {
		// Without auto-renew the leases taken so far run out: wait for the
		// next keys no longer than the earliest of them stays valid.
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if !cfg.autoRenew && len(held) > 0 {
			wctx, cancel = context.WithDeadlineCause(ctx, earliestExpiry(held), errHeldExpire)
		}
		var ls []*Lease
		var err error
		if len(g) == 1 || multi == nil || cfg.owner != "" {
			for _, k := range g {
				var l *Lease
				if l, err = c.acquire(wctx, k, opts, false); err != nil {
					break
				}
				ls = append(ls, l)
			}
		} else {
			ls, err = c.acquireGroupObserved(wctx, multi, g, cfg)
		}
		for i, l := range ls {
			held[g[i]] = l
		}
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, errHeldExpire) {
				var ae *AcquireError
				if errors.As(err, &ae) {
					err = &AcquireError{Key: ae.Key, Attempts: ae.Attempts, Cause: errHeldExpire}
				}
			}
			return fail(err)
		}
	}
	now := time.Now()
	for _, l := range held {
		if l.Err() != nil || !now.Before(l.Expires()) {
			return fail(&AcquireError{Key: l.Key(), Attempts: 1, Cause: errHeldExpire})
		}
	}
	out := make([]*Lease, len(keys))
	for i, k := range keys {
		out[i] = held[k]
	}
	return out, nil
}

// manyRequest validates AcquireMany's arguments and returns the keys in
// the order they are taken and the call's configuration.
func (c *Client) manyRequest(ctx context.Context, keys []string, opts []Option) ([]string, config, error) {
	cfg := c.cfg
	if ctx == nil {
		return nil, cfg, wrapOp("acquire", fmt.Sprint(keys), fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	if len(keys) == 0 {
		return nil, cfg, fmt.Errorf("dlock: acquire many: %w: no keys", ErrInvalidKey)
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	for i, k := range sorted {
		if err := ValidateKey(k); err != nil {
			return nil, cfg, wrapOp("acquire", shorten(k), err)
		}
		if i > 0 && sorted[i-1] == k {
			return nil, cfg, wrapOp("acquire", shorten(k), fmt.Errorf("%w: key given twice", ErrInvalidKey))
		}
	}
	if err := cfg.apply(opts); err != nil {
		return nil, cfg, wrapOp("acquire", fmt.Sprint(keys), err)
	}
	if err := c.effectiveTTL(&cfg); err != nil {
		return nil, cfg, wrapOp("acquire", fmt.Sprint(keys), err)
	}
	return sorted, cfg, nil
}

// errHeldExpire ends an AcquireMany wait that would outlast the leases
// already taken (WithAutoRenew(false)).
var errHeldExpire = errors.New("dlock: the leases already taken would expire before the remaining keys were acquired (auto-renew is off)")

func earliestExpiry(held map[string]*Lease) time.Time {
	var t time.Time
	for _, l := range held {
		if e := l.Expires(); t.IsZero() || e.Before(t) {
			t = e
		}
	}
	return t
}

// acquireGroupObserved is acquireGroup reported to the observers as one
// acquisition per key, as Acquire would report them.
func (c *Client) acquireGroupObserved(ctx context.Context, multi MultiAcquirer, keys []string, cfg config) ([]*Lease, error) {
	if len(cfg.observers) == 0 {
		return c.acquireGroup(ctx, multi, keys, cfg, nil)
	}
	start := time.Now()
	kctx := make([]context.Context, len(keys))
	for i, k := range keys {
		kctx[i] = observe(ctx, cfg.observers, Event{Kind: EventAcquireStart, Key: k})
	}
	ls, err := c.acquireGroup(ctx, multi, keys, cfg, kctx)
	for i, k := range keys {
		e := Event{Kind: EventAcquireEnd, Key: k, Err: err, Duration: time.Since(start)}
		if err == nil {
			e.Lease = ls[i]
		}
		observe(kctx[i], cfg.observers, e)
	}
	return ls, err
}

// acquireGroup is acquireLoop for a group taken in one step. kctx, when
// not nil, holds the observers' context of each key's acquisition.
func (c *Client) acquireGroup(ctx context.Context, multi MultiAcquirer, keys []string, cfg config, kctx []context.Context) ([]*Lease, error) {
	reqs := make([]Request, len(keys))
	for i, k := range keys {
		reqs[i] = Request{Key: k, TTL: cfg.ttl, Token: c.token(cfg), Reentrant: cfg.owner != ""}
	}
	var (
		timer   *time.Timer
		stopSub func()
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if stopSub != nil {
			stopSub()
		}
	}()
	for attempt := 1; ; attempt++ {
		invoke := time.Now()
		gs, err := multi.TryAcquireAll(ctx, reqs)
		if err != nil {
			if ctxend.Ended(ctx) {
				return nil, ctxAcquireError(fmt.Sprint(keys), attempt, ctx, err)
			}
			return nil, wrapOp("acquire", fmt.Sprint(keys), err)
		}
		blocked := -1
		for i, g := range gs {
			if kctx != nil {
				observe(kctx[i], cfg.observers, Event{Kind: EventAttempt, Key: keys[i], Attempt: attempt, Granted: g.OK, HolderTTL: g.HolderTTL})
			}
			if !g.OK && blocked < 0 {
				blocked = i
			}
		}
		if blocked < 0 {
			return c.grantAll(ctx, reqs, gs, invoke, cfg)
		}
		d, ok := cfg.wait.Delay(attempt)
		if !ok {
			return nil, &AcquireError{Key: keys[blocked], Attempts: attempt}
		}
		if ttl := gs[blocked].HolderTTL; ttl > 0 {
			d = min(d, ttl)
		}
		var sub <-chan struct{}
		if c.notifier != nil {
			if stopSub != nil {
				stopSub()
				stopSub = nil
			}
			ch, stop, err := c.notifier.Subscribe(ctx, keys[blocked])
			if err == nil {
				sub, stopSub = ch, stop
			}
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		var octx context.Context // the blocked key's observers' context
		if kctx != nil {
			octx = kctx[blocked]
		}
		if err := c.groupWait(ctx, keys[blocked], attempt, sub, timer.C, octx, cfg.observers); err != nil {
			return nil, err
		}
	}
}

// groupWait waits for a release notice on sub or the timer, for key (the
// group's blocked key) after attempt; with octx it reports the wait to obs.
func (c *Client) groupWait(ctx context.Context, key string, attempt int, sub <-chan struct{}, timer <-chan time.Time, octx context.Context, obs []Observer) error {
	if octx != nil {
		observe(octx, obs, Event{Kind: EventWaitStart, Key: key})
		defer observe(octx, obs, Event{Kind: EventWaitEnd, Key: key})
	}
	select {
	case <-ctx.Done():
		return ctxAcquireError(key, attempt, ctx, nil)
	case <-c.closing:
		return wrapOp("acquire", key, ErrClosed)
	case <-sub:
	case <-timer:
	}
	return nil
}

// grantAll turns a group grant into leases, or gives every lock back.
func (c *Client) grantAll(ctx context.Context, reqs []Request, gs []Grant, invoke time.Time, cfg config) ([]*Lease, error) {
	ls := make([]*Lease, 0, len(reqs))
	for i, r := range reqs {
		l, err := c.grant(ctx, r, gs[i], invoke, cfg, 1)
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.releaseTimeout)
			for _, l := range ls {
				_ = l.Release(rctx)
			}
			for j := i + 1; j < len(reqs); j++ {
				r := reqs[j]
				r.Fence = gs[j].Fence
				_ = c.b.Release(rctx, r)
			}
			cancel()
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}
