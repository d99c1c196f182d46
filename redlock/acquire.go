package redlock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// hold is what one node may hold after a failed or partly failed attempt,
// to be undone.
type hold struct {
	granted bool   // the node granted the lock to the attempt's token
	maybe   bool   // the node did not answer clearly: a grant may have landed
	fence   uint64 // the node's fence for the attempt's grant, 0 if unknown
	lease   bool   // the write-back may have renamed the owner to the lease's token
	renamed bool   // the write-back renamed it (confirmed)
	answer  bool   // the node answered the last call: undo it synchronously
}

// TryAcquire implements dlock.Backend: one Redlock attempt (see doc.go,
// "Acquiring"). It returns Grant{OK: false} with HolderTTL when other
// tokens hold the lock on too many nodes; an error joining a summary and
// one *dlock.NodeError per failed node when more than N − quorum nodes
// fail; and an error matching dlock.ErrNotAcquired when the attempt took
// longer than its validity. What a failed attempt may hold is given back.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := b.check(ctx, &r, true); err != nil {
		return dlock.Grant{}, err
	}
	a := b.newAcquisition(r)
	defer close(a.decided)
	if g, err, done := a.acquire(ctx); done {
		return g, err
	}
	if g, err, done := a.agree(); done {
		return g, err
	}
	if err := a.writeBack(ctx); err != nil {
		return dlock.Grant{}, err
	}
	return a.finish()
}

// acquisition is one Redlock attempt, one method per phase: acquire (every
// node runs redislock's acquire script), agree (settle the fence), writeBack
// (make the granting nodes hold the lease's token and fence) and finish
// (check the validity, give back what is not part of the lease).
type acquisition struct {
	b        *Backend
	r, nr    dlock.Request // the request, and as the nodes see it
	floor    uint64        // the proposed fence floor, 0 for a reentrant attempt
	start    time.Time
	timeout  time.Duration
	deadline time.Time

	acq   []answer[dlock.Grant]
	skews []atomic.Int64 // per node: its clock at a grant less ours at the reply (µs)
	seen  []atomic.Bool  // per node: skews holds a value
	holds []hold
	fence uint64 // the settled fence
	count int
	lease string // the lease's token on the nodes

	decided chan struct{} // closed when TryAcquire returns
	won     bool          // set before decided is closed: the attempt succeeded
}

func (b *Backend) newAcquisition(r dlock.Request) *acquisition {
	a := &acquisition{b: b, r: r, nr: r, start: time.Now(), timeout: b.cfg.timeout(r.TTL), decided: make(chan struct{})}
	a.deadline = a.start.Add(a.timeout)
	a.nr.Fence = 0
	if !r.Reentrant {
		a.floor = b.propose()
		a.nr.Token, a.nr.Fence = nodeToken(r.Token, a.floor), a.floor
	}
	a.skews = make([]atomic.Int64, len(b.nodes))
	a.seen = make([]atomic.Bool, len(b.nodes))
	return a
}

// lateGrant gives back a grant that came after the fan-out gave up on its
// node: the node is not part of the lease. Except a re-entry (count > 1)
// of a reentrant attempt that succeeded: it added one hold to an earlier
// one, as on the other nodes, and the lease's release takes it back.
func (a *acquisition) lateGrant(i int, g dlock.Grant, err error) {
	if err != nil || !g.OK {
		return
	}
	if a.r.Reentrant {
		if <-a.decided; a.won && g.Count > 1 {
			return
		}
	}
	rr := a.nr
	rr.Fence = g.Fence
	a.b.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		defer cancel()
		_ = a.b.nodes[i].Release(ctx, rr)
	})
}

// acquire runs the nodes' acquire scripts concurrently, each bounded by
// the node timeout, and records what each node may hold. done reports
// that the attempt ended (not granted, or failed) with g and err.
func (a *acquisition) acquire(ctx context.Context) (g dlock.Grant, err error, done bool) {
	b := a.b
	a.acq, err = gather(ctx, b, b.all, fan{deadline: a.deadline, timeout: a.timeout, grace: true},
		func(ctx context.Context, i int) (dlock.Grant, error) {
			g, now, err := b.nodes[i].TryAcquireClock(ctx, a.nr)
			if now > 0 {
				// A lower bound of the node's clock offset: the script ran
				// before the reply came. Not from the start of the attempt,
				// which a stalled client would inflate.
				a.skews[i].Store(now - time.Now().UnixMicro())
				a.seen[i].Store(true)
			}
			return g, err
		},
		b.acquireJudge, a.lateGrant)
	a.holds = make([]hold, len(b.nodes))
	granted, failures := 0, 0
	for i, an := range a.acq {
		switch {
		case an.done && an.err == nil && an.val.OK:
			a.holds[i] = hold{granted: true, fence: an.val.Fence, answer: true}
			granted++
		case an.done && an.err == nil:
			a.holds[i] = hold{answer: true} // held by another token: nothing to undo
		default:
			a.holds[i] = hold{maybe: true, answer: an.done}
			if failed(an, a.deadline) {
				failures++
			}
		}
	}
	if err != nil {
		a.undo(0)
		return dlock.Grant{}, fmt.Errorf("redlock: acquire %q: %w", a.r.Key, err), true
	}
	if granted < b.quorum {
		a.undo(0)
		if failures > len(b.nodes)-b.quorum {
			// Not contention: too few nodes work for any quorum.
			return dlock.Grant{}, joinErrs(
				fmt.Errorf("redlock: acquire %q: %d of %d nodes failed, so no quorum of %d can grant it", a.r.Key, failures, len(b.nodes), b.quorum),
				nodeErrors(b, b.all, a.acq, a.deadline, a.timeout, nil)), true
		}
		return dlock.Grant{HolderTTL: holderTTL(a.acq, b.quorum-granted)}, nil, true
	}
	return dlock.Grant{}, nil, false
}

// agree settles the fence of a quorum of grants. done reports that the
// attempt ended: granted without a write-back (every node issued the
// floor), not settled (a re-entry some nodes count and others do not),
// or out of validity.
func (a *acquisition) agree() (g dlock.Grant, err error, done bool) {
	b := a.b
	fence, count, settled := settle(a.acq, b.quorum)
	if !settled {
		// Neither a fresh grant (that would tell the Client its earlier
		// hold was lost) nor a sure re-entry: give it back and retry.
		a.undo(0)
		return dlock.Grant{}, nil, true
	}
	a.fence, a.count = fence, count
	if !a.r.Reentrant {
		b.learn(a.acq, a.skews, a.seen)
		if agreed(a.holds, a.acq, a.floor) {
			// Every node answered and every grant has the floor as its
			// fence: the granting nodes, a quorum, hold the lease under its
			// node token with its fence. Nothing is left to undo.
			if err := a.valid(); err != nil {
				a.undo(0)
				return dlock.Grant{}, err, true
			}
			a.won = true
			return dlock.Grant{OK: true, Fence: a.floor, Count: 1, Since: a.start}, nil, true
		}
		if a.fence == a.floor {
			// The lease's node token must differ from the attempt's, which
			// late grants on nodes that did not answer may still carry.
			a.fence++
		}
	}
	a.lease = nodeRequest(dlock.Request{Token: a.r.Token, Reentrant: a.r.Reentrant, Fence: a.fence}).Token
	return dlock.Grant{}, nil, false
}

// valid returns an error matching dlock.ErrNotAcquired when the attempt
// has no validity left: TTL − elapsed − Drift(TTL) ≤ 0.
func (a *acquisition) valid() error {
	if elapsed := time.Since(a.start); elapsed >= a.r.TTL-Drift(a.r.TTL) {
		return fmt.Errorf("redlock: acquire %q: %w: it took %v, leaving no validity of the TTL %v (drift allowance %v)",
			a.r.Key, dlock.ErrNotAcquired, elapsed.Round(time.Microsecond), a.r.TTL, Drift(a.r.TTL))
	}
	return nil
}

// writeBack makes every node that answered hold the attempt's grant as
// the lease's (token and fence, redislock's Adopt); a quorum must confirm.
// On failure it gives back what the attempt may hold.
func (a *acquisition) writeBack(ctx context.Context) error {
	b, r := a.b, a.r
	var targets []int
	for i, h := range a.holds {
		if h.answer {
			targets = append(targets, i)
		}
	}
	wbDeadline := time.Now().Add(a.timeout)
	// A write-back that comes after the fan-out gave up on its node: the
	// node is not part of the lease, so a non-reentrant attempt gives it
	// back, whether it was renamed or the reply was lost. A reentrant
	// token's hold there is the lease's.
	attemptFences := make([]uint64, len(a.holds)) // holds changes meanwhile
	for i, h := range a.holds {
		attemptFences[i] = h.fence
	}
	late := func(i int, v int64, err error) {
		if r.Reentrant || (err == nil && v == 0) {
			return
		}
		b.background(func() {
			ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
			defer cancel()
			if err != nil {
				_ = b.nodes[i].Release(ctx, dlock.Request{Key: r.Key, Token: a.nr.Token, TTL: r.TTL, Fence: attemptFences[i]})
			}
			_ = b.nodes[i].Release(ctx, dlock.Request{Key: r.Key, Token: a.lease, TTL: r.TTL, Fence: a.fence})
		})
	}
	wb, err := gather(ctx, b, targets, fan{deadline: wbDeadline, timeout: a.timeout, grace: true},
		func(ctx context.Context, i int) (int64, error) {
			return b.writeBack(ctx, i, r.Key, a.nr.Token, a.lease, a.fence)
		},
		quorumJudge(b.quorum, func(v int64, err error) bool { return err == nil && v == 1 }),
		late)
	renamed := 0
	for _, i := range targets {
		h := &a.holds[i]
		w := wb[i]
		h.answer = w.done
		switch {
		case w.done && w.err == nil && w.val == 1:
			h.renamed, h.lease = true, true
			renamed++
		case w.done && w.err == nil:
			h.granted = false // not held by the attempt (any more): nothing to undo
		case h.granted && w.done:
			// Failed: renamed or not, undo both ways (in that order, which
			// is right whenever the rename landed).
			h.lease = true
		case h.granted && !r.Reentrant:
			h.granted = false // still on its way: late undoes it
		}
	}
	if err != nil {
		a.undo(a.fence)
		return fmt.Errorf("redlock: acquire %q: %w", r.Key, err)
	}
	if renamed < b.quorum {
		a.undo(a.fence)
		return joinErrs(
			fmt.Errorf("redlock: acquire %q: the fence write-back was confirmed by %d of %d nodes, the quorum is %d", r.Key, renamed, len(b.nodes), b.quorum),
			nodeErrors(b, targets, wb, wbDeadline, a.timeout, nil))
	}
	return nil
}

// finish checks the validity and gives back, in the background, what the
// attempt may hold outside the lease (no answer to the acquire, a failed
// write-back; for a reentrant attempt, by the fence of its own grant
// there: a node left at a lower fence would hand a later re-entry a fence
// below the lease's).
func (a *acquisition) finish() (dlock.Grant, error) {
	if err := a.valid(); err != nil {
		a.undo(a.fence)
		return dlock.Grant{}, err
	}
	for i := range a.holds {
		h := &a.holds[i]
		if h.renamed {
			*h = hold{}
			continue
		}
		h.lease = false
		h.answer = false
	}
	a.undo(a.fence)
	a.won = true
	return dlock.Grant{OK: true, Fence: a.fence, Count: a.count, Since: a.start}, nil
}

// undo gives back what the attempt may hold (see Backend.undo).
func (a *acquisition) undo(fence uint64) {
	a.b.undo(a.r, a.nr, fence, a.holds, a.timeout)
}

// acquireJudge decides an acquisition's first phase: met with a quorum of
// grants; hopeless (fail fast) once a quorum can no longer grant it and
// the slow nodes cannot change what the failure is: more than N − quorum
// nodes failed (an error), or so few failed that even if every slow node
// fails too it is contention.
func (b *Backend) acquireJudge(ans []answer[dlock.Grant], pending int) (met, hopeless bool) {
	granted, failures := 0, 0
	for _, a := range ans {
		switch {
		case !a.done:
		case a.err != nil:
			failures++
		case a.val.OK:
			granted++
		}
	}
	spare := len(b.nodes) - b.quorum
	decided := failures > spare || failures+pending <= spare
	return granted >= b.quorum, granted+pending < b.quorum && decided
}

// settle returns the fence and hold count of a grant on a quorum: for a
// first grant (no node counts an earlier hold), the maximum fence over the
// granting nodes and count 1; for a re-entry (a quorum of nodes count an
// earlier hold, count > 1), the highest fence and count they report (a
// node whose write-back was lost reports the attempt's lower fence). ok is false when some
// but fewer than a quorum of nodes count an earlier hold: whether it is
// still held is not known (see doc.go).
func settle(acq []answer[dlock.Grant], quorum int) (fence uint64, count int, ok bool) {
	votes := make(map[uint64]int)
	held := 0
	for _, a := range acq {
		if a.done && a.err == nil && a.val.OK && a.val.Count > 1 {
			votes[a.val.Fence]++
			held++
		}
	}
	if held == 0 {
		for _, a := range acq {
			if a.done && a.err == nil && a.val.OK {
				fence = max(fence, a.val.Fence)
			}
		}
		return fence, 1, true
	}
	if held < quorum {
		return 0, 0, false
	}
	for f := range votes {
		fence = max(fence, f)
	}
	for _, a := range acq {
		if a.done && a.err == nil && a.val.OK && a.val.Count > 1 {
			count = max(count, a.val.Count)
		}
	}
	return fence, count, true
}

// agreed reports whether an attempt that proposed floor can skip the
// write-back: every node answered (no grant may still land anywhere) and
// every grant is a fresh one with the floor as its fence.
func agreed(holds []hold, acq []answer[dlock.Grant], floor uint64) bool {
	for i, a := range acq {
		if holds[i].maybe || !a.done {
			return false
		}
		if a.err == nil && a.val.OK && (a.val.Fence != floor || a.val.Count != 1) {
			return false
		}
	}
	return true
}

// holderTTL returns how long until need more nodes could be free: the
// n-th shortest remaining TTL among the nodes held by another token, where
// n is need less the nodes that did not answer (they may be free), or 0 if
// that is unknown. An underestimate costs the waiter an early retry; an
// overestimate, a late one when a release notification is lost.
func holderTTL(acq []answer[dlock.Grant], need int) time.Duration {
	var ttls []time.Duration
	for _, a := range acq {
		switch {
		case !a.done || a.err != nil:
			need--
		case !a.val.OK && a.val.HolderTTL > 0:
			ttls = append(ttls, a.val.HolderTTL)
		}
	}
	if need <= 0 || len(ttls) < need {
		return 0
	}
	slices.Sort(ttls)
	return ttls[need-1]
}

// writeBack makes node i hold the attempt's grant of key (token from) as
// the lease's (token to, fence), through redislock's Adopt. It returns 1
// when the node held the attempt's grant, 0 when it did not.
func (b *Backend) writeBack(ctx context.Context, i int, key, from, to string, fence uint64) (int64, error) {
	ok, err := b.nodes[i].Adopt(ctx, key, from, to, fence)
	if err != nil {
		return 0, fmt.Errorf("redlock: fence write-back on %s: %w", b.names[i], err)
	}
	if ok {
		return 1, nil
	}
	return 0, nil
}

// undo releases what a failed attempt may hold (see hold): synchronously
// on the nodes that answered, in the background on the others. A
// reentrant attempt shares its token with the holds it re-entered, so it
// gives back exactly one hold, and only where a grant is certain.
func (b *Backend) undo(r, nr dlock.Request, fence uint64, holds []hold, timeout time.Duration) {
	var wait sync.WaitGroup
	for i, h := range holds {
		var reqs []dlock.Request
		switch {
		case r.Reentrant:
			// By fence: only the hold this attempt added, never an earlier
			// grant with another fence.
			switch {
			case h.renamed:
				reqs = append(reqs, dlock.Request{Key: r.Key, Token: r.Token, TTL: r.TTL, Fence: fence})
			case h.granted && h.fence != 0:
				reqs = append(reqs, dlock.Request{Key: r.Key, Token: r.Token, TTL: r.TTL, Fence: h.fence})
			}
		default:
			if (h.granted || h.maybe) && !h.renamed {
				f := h.fence
				if h.maybe {
					f = 0 // unknown: any fence of this attempt's unique token
				}
				reqs = append(reqs, dlock.Request{Key: r.Key, Token: nr.Token, TTL: r.TTL, Fence: f})
			}
			if h.lease {
				reqs = append(reqs, nodeRequest(dlock.Request{Key: r.Key, Token: r.Token, TTL: r.TTL, Fence: fence}))
			}
		}
		if len(reqs) == 0 {
			continue
		}
		if h.answer {
			wait.Add(1)
		}
		ok := b.background(func() {
			if h.answer {
				defer wait.Done()
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			for _, q := range reqs {
				_ = b.nodes[i].Release(ctx, q)
			}
		})
		if !ok {
			if h.answer {
				wait.Done()
			}
			break
		}
	}
	wait.Wait()
}
