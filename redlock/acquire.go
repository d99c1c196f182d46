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
// tokens hold the lock on too many nodes (for a reentrant request: when
// no quorum of nodes holds the token's earlier grant with one fence); an
// error joining a summary and one *dlock.NodeError per failed node when
// more than N − quorum nodes fail; and an error matching
// dlock.ErrNotAcquired when the attempt took longer than its validity.
// What a failed attempt may hold is given back.
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
// node runs redislock's acquire script under the attempt's own token),
// agree (settle the fence), writeBack (make the granting nodes hold the
// lease's token and fence) and finish (check the validity, give back what
// is not part of the lease); or, for a reentrant request that finds the
// lock held, rejoin (re-enter the token's earlier grant).
type acquisition struct {
	b        *Backend
	r, nr    dlock.Request // the request, and the attempt's as the nodes see it
	floor    uint64        // the proposed fence floor
	start    time.Time
	timeout  time.Duration
	deadline time.Time

	acq   []answer[dlock.Grant]
	skews []atomic.Int64 // per node: its clock at a grant less ours at the reply (µs)
	seen  []atomic.Bool  // per node: skews holds a value
	holds []hold
	fence uint64 // the settled fence
	count int    // the hold count: 1, or a re-entry's
	lease string // the lease's token on the nodes

	decided chan struct{} // closed when TryAcquire returns
	won     bool          // set before decided is closed: the attempt succeeded
}

func (b *Backend) newAcquisition(r dlock.Request) *acquisition {
	a := &acquisition{b: b, r: r, nr: r, start: time.Now(), timeout: b.cfg.timeout(r.TTL), decided: make(chan struct{})}
	a.deadline = a.start.Add(a.timeout)
	// Every attempt, reentrant or not, takes the nodes under a token of its
	// own: a grant becomes the token's (the lease's) only once its fence
	// is settled, so another Client of the same owner never re-enters a
	// grant whose fence may still change. An owner's token is shared by
	// processes, whose floors may coincide: a reentrant attempt's token
	// also names this Backend.
	a.floor = b.propose()
	token := r.Token
	if r.Reentrant {
		token += "~" + b.id
	}
	a.nr.Token, a.nr.Fence, a.nr.Reentrant = nodeToken(token, a.floor), a.floor, false
	a.skews = make([]atomic.Int64, len(b.nodes))
	a.seen = make([]atomic.Bool, len(b.nodes))
	return a
}

// lateGrant gives back a grant that came after the fan-out gave up on its
// node: the node is not part of the lease.
func (a *acquisition) lateGrant(i int, g dlock.Grant, err error) {
	if err != nil || !g.OK {
		return
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
	granted, held, failures := 0, 0, 0
	for i, an := range a.acq {
		switch {
		case an.done && an.err == nil && an.val.OK:
			a.holds[i] = hold{granted: true, fence: an.val.Fence, answer: true}
			granted++
		case an.done && an.err == nil:
			a.holds[i] = hold{answer: true} // held by another token: nothing to undo
			held++
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
		if a.r.Reentrant && held >= b.quorum {
			// Held on a quorum: perhaps by this token's earlier grant.
			g, err := a.rejoin(ctx, holderTTL(a.acq, b.quorum-granted))
			return g, err, true
		}
		return dlock.Grant{HolderTTL: holderTTL(a.acq, b.quorum-granted)}, nil, true
	}
	return dlock.Grant{}, nil, false
}

// agree settles the fence of a quorum of grants: the maximum over the
// granting nodes. done reports that the attempt ended: granted without a
// write-back (every node issued the floor), or out of validity.
func (a *acquisition) agree() (g dlock.Grant, err error, done bool) {
	b := a.b
	for _, an := range a.acq {
		if an.done && an.err == nil && an.val.OK {
			a.fence = max(a.fence, an.val.Fence)
		}
	}
	a.count = 1
	b.learn(a.acq, a.skews, a.seen)
	// A reentrant lease holds the nodes under its token as it is: the
	// write-back renames the attempt's grants to it.
	if !a.r.Reentrant {
		if agreed(a.holds, a.acq, a.floor) {
			// Every grant has the floor as its fence: the granting nodes, a
			// quorum, hold the lease under its node token with its fence.
			if err := a.valid(); err != nil {
				a.undo(0)
				return dlock.Grant{}, err, true
			}
			a.won = true
			a.dropStragglers()
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
	// node is not part of the lease, so the attempt gives it back, whether
	// it was renamed or the reply was lost. (A reentrant lease's hold
	// there may meanwhile have been re-entered by another Client of the
	// owner: the release takes back one hold, not theirs.)
	attemptFences := make([]uint64, len(a.holds)) // holds changes meanwhile
	for i, h := range a.holds {
		attemptFences[i] = h.fence
	}
	late := func(i int, v int64, err error) {
		if err == nil && v == 0 {
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
		case h.granted:
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
// write-back: the attempt's token, by the fence of its grant there).
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
	a.b.undo(a.nr, a.lease, fence, a.holds, a.timeout)
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

// quorumFence returns the fence of a token's earlier grant that a quorum
// of nodes count (count > 1: the attempt's re-entry added a hold to it)
// and the highest hold count among them. ok is false when no fence has a
// quorum: nodes counting a hold of the token with another fence (an
// orphaned hold, see rejoin) are not part of the lease.
func quorumFence(acq []answer[dlock.Grant], quorum int) (fence uint64, count int, ok bool) {
	votes := make(map[uint64]int)
	for _, a := range acq {
		if a.done && a.err == nil && a.val.OK && a.val.Count > 1 {
			if votes[a.val.Fence]++; votes[a.val.Fence] >= quorum {
				fence, ok = a.val.Fence, true
			}
		}
	}
	if !ok {
		return 0, 0, false
	}
	for _, a := range acq {
		if rejoined(a, fence) {
			count = max(count, a.val.Count)
		}
	}
	return fence, count, true
}

// rejoined reports whether a node's answer re-entered the earlier grant
// with fence.
func rejoined(a answer[dlock.Grant], fence uint64) bool {
	return a.done && a.err == nil && a.val.OK && a.val.Count > 1 && a.val.Fence == fence
}

// rejoinJudge decides a re-entry's fan-out: met once a quorum of nodes
// counts one earlier grant, hopeless once no fence can reach a quorum.
func (b *Backend) rejoinJudge(ans []answer[dlock.Grant], pending int) (met, hopeless bool) {
	votes, best := make(map[uint64]int), 0
	for _, a := range ans {
		if a.done && a.err == nil && a.val.OK && a.val.Count > 1 {
			votes[a.val.Fence]++
			best = max(best, votes[a.val.Fence])
		}
	}
	return best >= b.quorum, best+pending < b.quorum
}

// rejoin re-enters, for a reentrant request whose attempt found the lock
// held on a quorum, the token's earlier grant: every node runs the acquire
// script under the token itself. The lease is the earlier grant's when a
// quorum of nodes count it with one fence (its fence, settled by the
// grant that made it, is reported and never written); every other hold
// this call added is given back by its fence: a fresh grant on a node that
// was free, a hold of the token with another fence. Otherwise the lock is
// reported held, with the attempt's holderTTL, and the Client retries.
func (a *acquisition) rejoin(ctx context.Context, holderTTL time.Duration) (dlock.Grant, error) {
	b, r := a.b, a.r
	r.Fence = 0
	giveBack := func(i int, fence uint64, wait *sync.WaitGroup) {
		if wait != nil {
			wait.Add(1)
		}
		ok := b.background(func() {
			if wait != nil {
				defer wait.Done()
			}
			ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
			defer cancel()
			rr := r
			rr.Fence = fence
			_ = b.nodes[i].Release(ctx, rr)
		})
		if !ok && wait != nil {
			wait.Done()
		}
	}
	late := func(i int, g dlock.Grant, err error) {
		if err != nil || !g.OK {
			return
		}
		if <-a.decided; a.won && g.Count > 1 && g.Fence == a.fence {
			return // one more node holding the lease: its release takes it back
		}
		giveBack(i, g.Fence, nil)
	}
	ans, err := gather(ctx, b, b.all, fan{deadline: time.Now().Add(a.timeout), timeout: a.timeout, grace: true},
		func(ctx context.Context, i int) (dlock.Grant, error) { return b.nodes[i].TryAcquire(ctx, r) },
		b.rejoinJudge, late)
	if err != nil {
		err = fmt.Errorf("redlock: acquire %q: %w", r.Key, err)
	}
	fence, count, ok := quorumFence(ans, b.quorum)
	if ok && err == nil {
		err = a.valid()
	}
	if err != nil || !ok {
		fence = 0 // give back every hold this call added
	}
	var wait sync.WaitGroup
	for i, an := range ans {
		if an.done && an.err == nil && an.val.OK && !rejoined(an, fence) {
			giveBack(i, an.val.Fence, &wait)
		}
	}
	wait.Wait()
	switch {
	case err != nil:
		return dlock.Grant{}, err
	case !ok:
		return dlock.Grant{HolderTTL: holderTTL}, nil
	}
	a.fence, a.count, a.won = fence, count, true
	return dlock.Grant{OK: true, Fence: fence, Count: count, Since: a.start}, nil
}

// agreed reports whether an attempt that proposed floor can skip the
// write-back: every grant it knows of (a quorum, see acquire) is a fresh
// one with the floor as its fence. A node that did not answer, or failed,
// is not part of the lease (see dropStragglers).
func agreed(holds []hold, acq []answer[dlock.Grant], floor uint64) bool {
	for i, a := range acq {
		if !holds[i].maybe && a.done && a.err == nil && a.val.OK && (a.val.Fence != floor || a.val.Count != 1) {
			return false
		}
	}
	return true
}

// dropStragglers gives back, in the background, what the nodes that did
// not answer the acquire (or failed) may hold for an attempt granted
// without a write-back: their grant, if it landed, carries the lease's
// node token but is not part of the lease (a grant that comes back after
// the fan-out ended is given back by lateGrant as well). The lease's own
// Refresh and Release act on its node token and fence only, so nothing
// else of it is touched.
func (a *acquisition) dropStragglers() {
	stragglers := false
	for i := range a.holds {
		h := &a.holds[i]
		if h.maybe {
			h.answer = false // do not wait for it
			stragglers = true
		} else {
			*h = hold{}
		}
	}
	if stragglers {
		a.undo(0)
	}
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
// on the nodes that answered, in the background on the others. nr is the
// attempt as the nodes saw it (its own token); lease the lease's token on
// the nodes, with fence.
func (b *Backend) undo(nr dlock.Request, lease string, fence uint64, holds []hold, timeout time.Duration) {
	var wait sync.WaitGroup
	for i, h := range holds {
		var reqs []dlock.Request
		if (h.granted || h.maybe) && !h.renamed {
			f := h.fence
			if h.maybe {
				f = 0 // unknown: any fence of this attempt's unique token
			}
			reqs = append(reqs, dlock.Request{Key: nr.Key, Token: nr.Token, TTL: nr.TTL, Fence: f})
		}
		if h.lease {
			// One hold of the lease's token: another Client of a reentrant
			// owner may have re-entered it meanwhile.
			reqs = append(reqs, dlock.Request{Key: nr.Key, Token: lease, TTL: nr.TTL, Fence: fence})
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
