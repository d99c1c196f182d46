package dlock

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// MultiAcquirer is an optional Backend capability: take several locks in
// one step, all or none (Redis: keys of one Cluster slot in one script).
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

// AcquireMany takes every key or none: the seed's "lock order:1 and
// order:2 together". Keys are taken in sorted order (groups the backend
// can take atomically, such as keys of one Redis Cluster slot, in one
// step), so two callers with overlapping key sets never deadlock; while a
// later key is awaited the earlier ones stay held. On failure every lock
// taken so far is released (with a fresh context bounded by the release
// timeout) and the error of the key that failed is returned. The leases
// are returned in the order of keys, each with its own fence; release
// each of them. WithFIFO applies to keys taken one by one; a group taken
// in one step waits by retrying on notifications. No keys, an invalid key or a key given twice is an
// ErrInvalidKey error.
func (c *Client) AcquireMany(ctx context.Context, keys []string, opts ...Option) ([]*Lease, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil Client", ErrInvalidOption)
	}
	if c.err != nil {
		return nil, wrapOp("acquire", fmt.Sprint(keys), c.err)
	}
	if ctx == nil {
		return nil, wrapOp("acquire", fmt.Sprint(keys), fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("dlock: acquire many: %w: no keys", ErrInvalidKey)
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	for i, k := range sorted {
		if err := ValidateKey(k); err != nil {
			return nil, wrapOp("acquire", shorten(k), err)
		}
		if i > 0 && sorted[i-1] == k {
			return nil, wrapOp("acquire", shorten(k), fmt.Errorf("%w: key given twice", ErrInvalidKey))
		}
	}
	cfg := c.cfg
	if err := cfg.apply(opts); err != nil {
		return nil, wrapOp("acquire", fmt.Sprint(keys), err)
	}

	var groups [][]string
	multi, _ := c.b.(MultiAcquirer)
	if multi != nil {
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
		if len(g) == 1 || multi == nil {
			for _, k := range g {
				l, err := c.acquire(ctx, k, opts, false)
				if err != nil {
					return fail(err)
				}
				held[k] = l
			}
			continue
		}
		ls, err := c.acquireGroup(ctx, multi, g, cfg)
		if err != nil {
			return fail(err)
		}
		for i, k := range g {
			held[k] = ls[i]
		}
	}
	out := make([]*Lease, len(keys))
	for i, k := range keys {
		out[i] = held[k]
	}
	return out, nil
}

// acquireGroup is acquireLoop for a group taken in one step.
func (c *Client) acquireGroup(ctx context.Context, multi MultiAcquirer, keys []string, cfg config) ([]*Lease, error) {
	reqs := make([]Request, len(keys))
	for i, k := range keys {
		reqs[i] = Request{Key: k, TTL: cfg.ttl, Token: c.token(cfg), Reentrant: cfg.owner != ""}
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for attempt := 1; ; attempt++ {
		invoke := time.Now()
		gs, err := multi.TryAcquireAll(ctx, reqs)
		if err != nil {
			if ctx.Err() != nil {
				return nil, &AcquireError{Key: fmt.Sprint(keys), Attempts: attempt, Cause: context.Cause(ctx)}
			}
			return nil, wrapOp("acquire", fmt.Sprint(keys), err)
		}
		blocked := -1
		for i, g := range gs {
			if !g.OK {
				blocked = i
				break
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
			ch, stop, err := c.notifier.Subscribe(ctx, keys[blocked])
			if err == nil {
				defer stop()
				sub = ch
			}
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, &AcquireError{Key: keys[blocked], Attempts: attempt, Cause: context.Cause(ctx)}
		case <-sub:
		case <-timer.C:
		}
	}
}

// grantAll turns a group grant into leases, or gives every lock back.
func (c *Client) grantAll(ctx context.Context, reqs []Request, gs []Grant, invoke time.Time, cfg config) ([]*Lease, error) {
	ls := make([]*Lease, 0, len(reqs))
	for i, r := range reqs {
		l, err := c.grant(ctx, r, gs[i], invoke, cfg)
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
