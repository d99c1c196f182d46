package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// answer is one node's part in a fanned-out call.
type answer[T any] struct {
	done bool // the node replied (val, or err) before the fan-out ended
	val  T
	err  error
}

// gather calls call on each node in idx concurrently. After each reply,
// judge (run on the collecting goroutine, so it may read ans freely)
// reports whether the call's goal is met (a quorum agrees) or hopeless
// (can no longer be met). gather returns the answers, indexed like
// Backend.nodes, when:
//
//   - every node in idx replied;
//   - judge reports met or hopeless (fail fast: the outcome no longer
//     depends on slow nodes): at once, or with f.grace after a grace
//     period in which nodes about as fast as the others still reply (a
//     lease held on every node survives more failures than one held on a
//     bare quorum, and a failed attempt undoes at once what it knows
//     of), while a node that is down costs the grace, not the deadline.
//     The grace is the time the decision took, at least graceMin;
//   - the deadline passes (extended once if the timer fired late: see
//     below);
//   - ctx ends: the error is then ctx's.
//
// Each call runs on a worker goroutine of its own (see workers) with the
// context callCtxs gives it; with f.detach the calls still running when gather returns are
// not cancelled (a release or a refresh that a slow node still applies
// helps). A reply that comes after gather returned goes to late, if not
// nil, on the call's goroutine (to give back a late grant, undo a late
// subscription). The goroutines never block on gather.
func gather[T any](ctx context.Context, b *Backend, idx []int, f fan,
	call func(ctx context.Context, i int) (T, error),
	judge func(ans []answer[T], pending int) (met, hopeless bool),
	late func(i int, v T, err error),
) ([]answer[T], error) {
	ans := make([]answer[T], len(b.nodes))
	if len(idx) == 0 {
		return ans, ctx.Err()
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type reply struct {
		i   int
		v   T
		err error
	}
	var (
		mu       sync.Mutex
		returned bool
		ch       = make(chan reply, len(idx)) // room for every reply
	)
	deadline, timeout := f.deadline, f.timeout
	start := time.Now()
	nctx, ncancel := b.callCtxs(cctx, idx, deadline, timeout, f.detach)
	for _, i := range idx {
		b.workers.run(func() {
			v, err := call(nctx(i), i)
			ncancel()
			mu.Lock()
			if returned {
				mu.Unlock()
				if late != nil {
					late(i, v, err)
				}
				return
			}
			ch <- reply{i, v, err}
			mu.Unlock()
		})
	}
	// finish keeps the replies already sent: after it, every reply is late.
	finish := func() ([]answer[T], error) {
		mu.Lock()
		returned = true
		mu.Unlock()
		for {
			select {
			case r := <-ch:
				ans[r.i] = answer[T]{done: true, val: r.v, err: r.err}
			default:
				return ans, ctx.Err()
			}
		}
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	graced, extended := false, false
	for pending := len(idx); pending > 0; {
		select {
		case r := <-ch:
			pending--
			ans[r.i] = answer[T]{done: true, val: r.v, err: r.err}
			if graced {
				continue // decided: only collecting for the grace
			}
			met, hopeless := judge(ans, pending)
			if !met && !hopeless {
				continue
			}
			if !f.grace {
				return finish()
			}
			graced = true
			if g := max(time.Since(start), graceMin); g < time.Until(deadline) {
				timer.Reset(g)
			}
		case <-timer.C:
			// A timer that fires well after its time means this process was
			// not running (a loaded machine, a stop): the replies that came
			// meanwhile have not been read yet. Give them as long again as
			// the lateness, once, bounded by the node timeout. The lease's
			// validity counts the extra time.
			if lateBy := time.Since(deadline); !extended && !graced && lateBy > graceMin {
				extended = true
				timer.Reset(min(lateBy, timeout))
				continue
			}
			return finish()
		case <-ctx.Done():
			return finish()
		}
	}
	return ans, ctx.Err()
}

// fan configures one gather.
type fan struct {
	deadline time.Time     // give up on the nodes that did not answer by then
	timeout  time.Duration // the node timeout the deadline comes from
	grace    bool          // once the goal is met, wait a little for the others
	detach   bool          // calls outlive the fan-out: not cancelled when it ends
}

// callCtxs returns the context of each call on a node of idx in a
// fan-out, made from ctx (the fan-out's, cancelled when it ends) to suit
// the node's client, and done, which every call runs once when it
// returns. The fan-out's collector enforces the deadline; the call runs
// directly on its worker, never on a redislock helper goroutine (one
// goroutine hand-off fewer per node and call, which shows on a loaded
// machine):
//
//   - with ContextTimeoutEnabled, go-redis bounds the call by the deadline
//     plus one node timeout (room for the collector's one extension), and
//     the end of the fan-out cancels it unless detach is set;
//   - otherwise the call is bounded by the client's ReadTimeout and
//     WriteTimeout, and a reply after the fan-out ended goes to its late
//     handler.
//
// The calls share one context of each kind: one timer per fan-out, not
// one per node, released by the last call's done.
func (b *Backend) callCtxs(ctx context.Context, idx []int, deadline time.Time, timeout time.Duration, detach bool) (func(i int) context.Context, func()) {
	if detach {
		ctx = context.WithoutCancel(ctx)
	}
	var timed, plain context.Context
	cancel := context.CancelFunc(func() {})
	for _, i := range idx {
		switch {
		case b.cte[i] && timed == nil:
			timed, cancel = context.WithDeadline(ctx, deadline.Add(timeout))
		case !b.cte[i] && plain == nil:
			plain = context.WithoutCancel(ctx)
		}
	}
	var left atomic.Int32
	left.Store(int32(len(idx)))
	of := func(i int) context.Context {
		if b.cte[i] {
			return timed
		}
		return plain
	}
	return of, func() {
		if left.Add(-1) == 0 {
			cancel()
		}
	}
}

// quorumJudge returns a judge for "at least need replies satisfy ok": met
// once they do, hopeless once the pending ones cannot make up the
// difference.
func quorumJudge[T any](need int, ok func(v T, err error) bool) func([]answer[T], int) (bool, bool) {
	return func(ans []answer[T], pending int) (bool, bool) {
		n := 0
		for _, a := range ans {
			if a.done && ok(a.val, a.err) {
				n++
			}
		}
		return n >= need, n+pending < need
	}
}

// errNoReply is the failure of a node that did not answer within the node
// timeout. It matches context.DeadlineExceeded.
type errNoReply struct{ timeout time.Duration }

func (e *errNoReply) Error() string {
	return fmt.Sprintf("redlock: no reply within the node timeout %v", e.timeout)
}

func (e *errNoReply) Is(target error) bool { return target == context.DeadlineExceeded }

// failed reports whether a node failed its part in a fan-out: it replied
// with an error, or had not replied when the deadline passed. A node that
// was not awaited because the outcome was decided without it did not fail.
func failed[T any](a answer[T], deadline time.Time) bool {
	return a.err != nil || !a.done && !time.Now().Before(deadline)
}

// nodeErrors returns a *dlock.NodeError for every node in idx that failed
// (see failed), skipping the errors for which skip (if not nil) returns
// true.
func nodeErrors[T any](b *Backend, idx []int, ans []answer[T], deadline time.Time, timeout time.Duration, skip func(error) bool) []error {
	var errs []error
	late := !time.Now().Before(deadline)
	for _, i := range idx {
		a := ans[i]
		var err error
		switch {
		case a.done && a.err != nil:
			err = a.err
			if skip != nil && skip(err) {
				continue
			}
		case !a.done && late:
			err = &errNoReply{timeout: timeout}
		default:
			continue
		}
		errs = append(errs, &dlock.NodeError{Node: b.names[i], Err: err})
	}
	return errs
}

// joinErrs puts a summary first, then the node errors, in one error that
// matches each of them with errors.Is and errors.As.
func joinErrs(summary error, nodeErrs []error) error {
	if len(nodeErrs) == 0 {
		return summary
	}
	return errors.Join(append([]error{summary}, nodeErrs...)...)
}
