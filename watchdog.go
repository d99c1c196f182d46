package dlock

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// The watchdog is one timer per Client (time.AfterFunc): no goroutine
// runs while nothing is due, and taking a lease costs a heap push and at
// most a timer reset. It keeps two heaps: auto-renewed leases ordered by
// their next renewal, and the other leases ordered by expiry. Renewals
// due within a short window are sent together in one batch (one round
// trip per server with a BatchRefresher, else one call per lease, up to
// 256 at once), on the timer's goroutine. A BatchRefresher gets a large
// batch in chunks of refreshChunk leases, one after another under the
// batch's deadline, the leases that expire first in the first chunk: a
// batch that runs out of time has renewed its first chunks rather than
// none, and retries only the rest. A lease is in at most one batch, and a
// batch in flight holds back no other, so a renewal that hangs delays
// neither the renewals nor the expiry of other leases. A batch's deadline
// is never past the earliest expiry in it, so a backend that honours its
// context returns in time to report a loss at Expires.
//
// A lease is renewed TTL/3 after the invoke time of its last successful
// renewal, or up to TTL/6 earlier when it can join a batch. A failed
// renewal is retried (every TTL/10, at least 1 ms and at most half the
// remaining validity) until the lease could have expired (Expires); then
// the lease is lost. ErrNotHeld from the server loses it at once.

// track registers a new lease with the watchdog. c.mu must be held.
func (c *Client) track(l *Lease) {
	if l.autoRenew {
		l.next = l.created.Add(l.valid / 3)
		heap.Push(&c.renew, l)
	} else {
		l.expAt = l.expires
		heap.Push(&c.expiry, l)
	}
	c.scheduleLocked()
}

// scheduleLocked sets the timer to the earliest thing due: an expiry or a
// renewal. A timer that fires early (the lease it was set for was
// released) finds nothing to do and reschedules. c.mu must be held.
func (c *Client) scheduleLocked() {
	var at time.Time
	if c.expiry.Len() > 0 {
		at = c.expiry.top().expAt
	}
	if c.renew.Len() > 0 {
		if t := c.renew.top().next; at.IsZero() || t.Before(at) {
			at = t
		}
	}
	if at.IsZero() || c.closed {
		return // nothing due; a pending timer fires once and finds nothing
	}
	if !c.timerAt.IsZero() && !at.Before(c.timerAt) {
		return // the timer already fires early enough
	}
	c.timerAt = at
	d := max(time.Until(at), 0)
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.tick)
	} else {
		c.timer.Reset(d)
	}
}

type renewResult struct {
	leases []*Lease
	reqs   []Request
	invoke time.Time
	errs   []error
}

// tick runs when the timer fires: it loses expired leases and sends the
// renewals that are due as one batch, on this goroutine.
func (c *Client) tick() {
	now := time.Now()
	var lost, batch []*Lease
	c.mu.Lock()
	c.timerAt = time.Time{}
	if c.closed {
		c.mu.Unlock()
		return
	}
	for c.expiry.Len() > 0 && !now.Before(c.expiry.top().expAt) {
		lost = append(lost, heap.Pop(&c.expiry).(*Lease))
	}
	if c.renew.Len() > 0 && !now.Before(c.renew.top().next) {
		// Something is due: renew it together with every lease due in
		// the next TTL/6, so leases taken at different moments fall
		// into step and share round trips.
		for c.renew.Len() > 0 {
			l := c.renew.top()
			if l.next.After(now.Add(l.ttl / 6)) {
				break
			}
			heap.Pop(&c.renew)
			if !now.Before(l.Expires()) {
				lost = append(lost, l)
				continue
			}
			batch = append(batch, l)
		}
	}
	if len(batch) > 0 {
		c.batches.Add(1)
	}
	c.scheduleLocked()
	c.mu.Unlock()

	for _, l := range lost {
		l.expire(errors.New("lease expired before it was renewed"))
	}
	if len(batch) > 0 {
		defer c.batches.Done()
		c.settle(c.renewBatch(batch))
	}
}

// refreshCalls bounds the Refresh calls a batch runs at once on a backend
// without RefreshMany (each holds a goroutine).
const refreshCalls = 256

// refreshChunk is the most leases one RefreshMany call renews.
const refreshChunk = 10_000

// renewBatch refreshes leases in one call (RefreshMany), or in one call
// per lease run concurrently (up to refreshCalls at once). The deadline is the shortest TTL/3 in the
// batch, and never past the earliest expiry.
func (c *Client) renewBatch(leases []*Lease) renewResult {
	now := time.Now()
	exps := make([]time.Time, len(leases))
	for i, l := range leases {
		exps[i] = l.Expires()
	}
	if c.batch != nil && len(leases) > refreshChunk {
		// The first chunks are the ones sure to be sent: the leases that
		// expire first go there. leases is this batch's own slice.
		sort.Stable(byExpiry{leases, exps})
	}
	r := renewResult{leases: leases, reqs: make([]Request, len(leases)), invoke: now}
	timeout := time.Duration(1<<63 - 1)
	for i, l := range leases {
		r.reqs[i] = l.request()
		timeout = min(timeout, r.reqs[i].TTL/3, max(exps[i].Sub(now), time.Millisecond))
	}
	timeout = max(timeout, time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	switch {
	case c.batch != nil && len(leases) > 1:
		r.errs = make([]error, 0, len(r.reqs))
		for lo := 0; lo < len(r.reqs); lo += refreshChunk {
			chunk := r.reqs[lo:min(lo+refreshChunk, len(r.reqs))]
			if err := ctx.Err(); err != nil {
				for range chunk {
					r.errs = append(r.errs, err)
				}
				continue
			}
			r.errs = append(r.errs, c.batch.RefreshMany(ctx, chunk)...)
		}
	case len(leases) == 1:
		r.errs = []error{c.b.Refresh(ctx, r.reqs[0])}
	default:
		// One call per lease, up to refreshCalls at once: a call that
		// hangs must not use up the others' time.
		r.errs = make([]error, len(leases))
		slots := make(chan struct{}, refreshCalls)
		var wg sync.WaitGroup
		for i := range r.reqs {
			slots <- struct{}{}
			wg.Go(func() {
				r.errs[i] = c.b.Refresh(ctx, r.reqs[i])
				<-slots
			})
		}
		wg.Wait()
	}
	cancel()
	return r
}

// byExpiry sorts leases by their expiries, exps.
type byExpiry struct {
	leases []*Lease
	exps   []time.Time
}

func (b byExpiry) Len() int           { return len(b.leases) }
func (b byExpiry) Less(i, j int) bool { return b.exps[i].Before(b.exps[j]) }
func (b byExpiry) Swap(i, j int) {
	b.leases[i], b.leases[j] = b.leases[j], b.leases[i]
	b.exps[i], b.exps[j] = b.exps[j], b.exps[i]
}

// settle applies a batch's results: renewed leases get a new expiry and
// renewal time; failed ones are retried or lost.
func (c *Client) settle(r renewResult) {
	now := time.Now()
	var lost []*Lease
	var causes []error
	report := make([]bool, len(r.leases)) // leases still live: their renewal is news
	c.mu.Lock()
	defer func() {
		c.mu.Lock()
		c.scheduleLocked()
		c.mu.Unlock()
	}()
	for i, l := range r.leases {
		err := r.errs[i]
		ttl := r.reqs[i].TTL
		l.mu.Lock()
		ended := l.err != nil
		if err == nil && !ended {
			if e := r.invoke.Add(ttl - drift(ttl)); e.After(l.expires) {
				l.expires = e
			}
		}
		expires := l.expires
		l.mu.Unlock()
		if ended || l.releasingLocked() {
			continue
		}
		report[i] = true
		// The lease's TTL now: a Refresh during the batch may have changed it.
		cur := l.TTL()
		switch {
		case err == nil:
			l.next = r.invoke.Add(min(ttl, cur) / 3)
		case errors.Is(err, ErrNotHeld):
			lost, causes = append(lost, l), append(causes, err)
			continue
		case !now.Before(expires):
			lost, causes = append(lost, l), append(causes, fmt.Errorf("%w (renewals failed until it could have expired)", err))
			continue
		default:
			l.next = now.Add(retryAfter(cur, expires.Sub(now)))
		}
		heap.Push(&c.renew, l)
	}
	c.mu.Unlock()
	for i, l := range r.leases {
		if report[i] && len(l.observers) > 0 {
			observe(context.Background(), l.observers, Event{Kind: EventRenewed, Key: l.req.Key, Lease: l, Err: r.errs[i]})
		}
	}
	for i, l := range lost {
		if errors.Is(causes[i], ErrNotHeld) {
			l.lose(causes[i])
		} else {
			l.expire(causes[i])
		}
	}
}

func (l *Lease) releasingLocked() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.releasing
}

// leaseHeap is a min-heap of leases by the time at returns; idx points at
// the lease's index field for this heap (-1 when absent).
type leaseHeap struct {
	items []*Lease
	at    func(*Lease) time.Time
	idx   func(*Lease) *int
}

func (h *leaseHeap) Len() int           { return len(h.items) }
func (h *leaseHeap) Less(i, j int) bool { return h.at(h.items[i]).Before(h.at(h.items[j])) }
func (h *leaseHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	*h.idx(h.items[i]) = i
	*h.idx(h.items[j]) = j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*Lease)
	*h.idx(l) = len(h.items)
	h.items = append(h.items, l)
}
func (h *leaseHeap) Pop() any {
	n := len(h.items) - 1
	l := h.items[n]
	h.items[n] = nil
	h.items = h.items[:n]
	*h.idx(l) = -1
	return l
}
func (h *leaseHeap) top() *Lease { return h.items[0] }
func (h *leaseHeap) remove(l *Lease) {
	if i := *h.idx(l); i >= 0 {
		heap.Remove(h, i)
	}
}

// retryAfter is how long to wait before retrying a failed renewal of a
// lease of ttl whose lock has left until it could expire: a tenth of the
// TTL, at most half of what is left, at least a millisecond.
func retryAfter(ttl, left time.Duration) time.Duration {
	return min(max(ttl/10, time.Millisecond), max(left/2, time.Millisecond))
}
