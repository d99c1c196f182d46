package zklock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// retryDelay is the first pause before a request that failed for want of
// a connection is retried; it doubles up to a second (see retry).
const retryDelay = 20 * time.Millisecond

// A waiter takes one acquisition's lock node through its key's queue:
// from the listing that places it to the grant, or to giving up. The
// package documentation describes the protocol (Acquiring); its phases
// are the methods of waiter: list and place the node, watch the nodes
// ahead (watchAhead), await their events.
type waiter struct {
	b       *Backend
	r       dlock.Request
	keyPath string
	path    string // our lock node
	name    string // its name in the queue
	czxid   int64  // its czxid (the fence), 0 until known
	session int64  // its ephemeral owner, unless read from own
	wait    bool   // Wait, not TryAcquire

	// own is our node's Stat and an existence watch on it, read only when
	// needed: when the create did not tell the czxid, or when we wait
	// second in line or further back, where its watch makes the
	// predecessor's deletion a grant without listing again.
	own *statResult

	children []string // the last listing
	listed   bool     // children was listed since the last wake-up

	i       int             // our place in the queue at the last listing
	pred    string          // the node just ahead of ours
	pp      string          // the node ahead of pred, "" if none
	watch   <-chan zk.Event // on pred
	ppWatch <-chan zk.Event // on pp, nil when not watched

	// signal is the predecessor's node and data version a permit waiter
	// last took for a grant's signal (see watchShared).
	signal struct {
		path    string
		version int32
	}

	lastOK time.Time     // the last answer from the server
	delay  time.Duration // the next pause before a retry
	gone   bool          // our node vanished: nothing to clean up
}

// step is what a phase of the waiter leads to.
type step int

const (
	stepList   step = iota // list the queue again (unless listed holds a fresh listing)
	stepGrant              // our node heads the queue
	stepGiveUp             // TryAcquire: our node is not first
	stepWatch              // watch the nodes ahead
	stepAwait              // wait for an event on a watched node
)

// queue takes node through the queue of keyPath: granted when it is
// first (permit and read nodes: see runShared); else, for Wait, watching
// the nodes ahead until it is, and for TryAcquire, Grant{OK: false}.
// Whatever ends without a grant deletes the node (unless it vanished),
// and an ended ctx returns ctx's error.
func (b *Backend) queue(ctx context.Context, r dlock.Request, keyPath string, node created, wait bool) (dlock.Grant, error) {
	w := &waiter{
		b: b, r: r, keyPath: keyPath, path: node.path, name: baseName(node.path),
		czxid: node.czxid, session: b.conn.SessionID(), wait: wait,
		lastOK: time.Now(), delay: retryDelay,
	}
	var g dlock.Grant
	var err error
	if r.Kind == dlock.KindLock {
		g, err = w.run(ctx)
	} else {
		g, err = w.runShared(ctx)
	}
	if err == nil && g.OK {
		return g, nil
	}
	if !w.gone {
		b.abandon(w.path)
	}
	if err != nil && ctx.Err() != nil {
		return dlock.Grant{}, ctx.Err()
	}
	return g, err
}

// run lists and places the node until a phase grants it, gives up or
// fails.
func (w *waiter) run(ctx context.Context) (dlock.Grant, error) {
	for {
		if !w.listed {
			children, err := w.list(ctx)
			if err != nil {
				if err := w.retry(ctx, err); err != nil {
					return dlock.Grant{}, err
				}
				continue
			}
			w.children = children
		}
		w.listed = false
		w.answered()
		s, err := w.place(ctx)
		if err == nil && s == stepWatch {
			s, err = w.watchAhead(ctx)
		}
		if err == nil && s == stepAwait {
			s, err = w.await(ctx)
		}
		switch {
		case err != nil:
			return dlock.Grant{}, err
		case s == stepGrant:
			return w.b.granted(w.r, w.path, w.czxid, w.session, w.own)
		case s == stepGiveUp:
			return dlock.Grant{}, nil
		}
	}
}

// list reads the queue's children, bounded by ctx.
func (w *waiter) list(ctx context.Context) ([]string, error) {
	return await(ctx, func() ([]string, error) {
		c, _, err := w.b.conn.Children(w.keyPath)
		return c, err
	})
}

// answered notes an answer from the server: retries start afresh.
func (w *waiter) answered() { w.lastOK, w.delay = time.Now(), retryDelay }

// retry decides what a failed request means. A Wait goes on after a
// failure that says only that the connection is down (the session, and
// our node, may well be alive): it returns nil after a pause (retryDelay,
// doubling up to a second, within ctx), until a whole session timeout has
// passed without an answer. Otherwise it returns ctx's error or err.
func (w *waiter) retry(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if w.wait && transient(err) && time.Since(w.lastOK) < w.b.SessionTimeout() && sleepCtx(ctx, w.delay) {
		w.delay = backoff(w.delay)
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// vanished is the error of a node deleted while queued: the session
// expired, or someone deleted it. Nothing is left to clean up.
func (w *waiter) vanished() error {
	w.gone = true
	return fmt.Errorf("lock node %s vanished while queued (session expired?): %w", w.path, zk.ErrNoNode)
}

// place finds our node in the last listing: first is a grant (after
// reading our node when its czxid is unknown); further back, TryAcquire
// gives up and Wait watches the nodes ahead.
func (w *waiter) place(ctx context.Context) (step, error) {
	w.i, w.pred, w.pp = position(w.children, w.name)
	switch {
	case w.i < 0:
		return 0, w.vanished()
	case w.i > 0 && permitAhead(w.children, w.name):
		return 0, wrongKind(w.r.Key, w.r, dlock.KindPermit)
	case w.i > 0 && !w.wait:
		return stepGiveUp, nil
	case w.i > 0:
		return stepWatch, nil
	case w.own == nil && w.czxid == 0:
		return w.readOwn(ctx, stepGrant)
	}
	return stepGrant, nil
}

// readOwn reads our node's Stat with an existence watch and, when it
// exists, goes on to then.
func (w *waiter) readOwn(ctx context.Context, then step) (step, error) {
	res, err := w.b.watchOwn(ctx, w.path)
	return w.useOwn(ctx, res, err, then)
}

// useOwn takes the answer of an ExistsW on our node: it records it and
// returns then, or stepList after a failure worth retrying, or an error.
func (w *waiter) useOwn(ctx context.Context, res statResult, err error, then step) (step, error) {
	switch {
	case err != nil:
		if err := w.retry(ctx, err); err != nil {
			return 0, err
		}
		return stepList, nil
	case !res.exists:
		return 0, w.vanished()
	}
	w.own = &res
	w.czxid, w.session = res.stat.Czxid, res.stat.EphemeralOwner
	return then, nil
}

// watchAhead watches the predecessor; third or further in line, the node
// before it too (its absence only costs a shortcut); and our own node
// when the grant will need it. The requests are pipelined on the
// connection (one round trip), and the server answers them in the order
// sent. A predecessor already gone is a grant when it was the only node
// ahead and our node's watch is armed; otherwise the queue is listed
// again.
func (w *waiter) watchAhead(ctx context.Context) (step, error) {
	b := w.b
	var (
		ppc  chan (<-chan zk.Event)
		ownc chan result[statResult]
	)
	if w.pp != "" && b.watchAhead {
		ppc = make(chan (<-chan zk.Event), 1)
		go func() { ppc <- b.watchBefore(ctx, w.keyPath+"/"+w.pp) }()
	}
	if w.own == nil && (w.czxid == 0 || w.i == 1 || ppc != nil) {
		ownc = make(chan result[statResult], 1)
		go func() {
			res, err := b.watchOwn(ctx, w.path)
			ownc <- result[statResult]{res, err}
		}()
	}
	watch, err := b.watchNode(ctx, w.keyPath+"/"+w.pred)
	w.watch, w.ppWatch = watch, nil
	if ppc != nil {
		w.ppWatch = <-ppc
	}
	if ownc != nil {
		res := <-ownc
		if s, err := w.useOwn(ctx, res.v, res.err, stepAwait); err != nil || s != stepAwait {
			return s, err
		}
	}
	switch {
	case errors.Is(err, zk.ErrNoNode) && w.i == 1 && w.own.armed():
		// The predecessor, the only node ahead at the listing, left before
		// its watch was set, and our node still exists: ours is the head.
		return stepGrant, nil
	case errors.Is(err, zk.ErrNoNode):
		return stepList, nil
	case err != nil:
		if err := w.retry(ctx, err); err != nil {
			return 0, err
		}
		return stepList, nil
	}
	return stepAwait, nil
}

// await waits for an event on the watched nodes: the predecessor's
// deletion, second in line with our node's watch armed, is the grant;
// other events list the queue again, or (the node before the
// predecessor) move us up. ctx or Close ending the wait is an error.
func (w *waiter) await(ctx context.Context) (step, error) {
	for {
		select {
		case ev := <-w.watch:
			return w.predecessorEvent(ev), nil
		case ev := <-w.ppWatch:
			if s, done, err := w.aheadEvent(ctx, ev); done {
				return s, err
			}
		case ev := <-w.own.ch():
			if ev.Type == zk.EventNodeDeleted {
				return 0, w.vanished()
			}
			w.own.watch = nil // no longer watched: no shortcut
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-w.b.ctx.Done():
			return 0, errClosed
		}
	}
}

// predecessorEvent handles the event of the predecessor's watch. Nodes
// ahead of ours only ever leave (later nodes get higher sequence
// numbers), so when the predecessor was the head and our node's watch has
// not fired (a deletion of ours would have come first), its deletion is
// the grant without listing again. Anything else lists again.
func (w *waiter) predecessorEvent(ev zk.Event) step {
	if ev.Type == zk.EventNodeDeleted && w.i == 2 && deleted(w.ppWatch) {
		w.i = 1 // both nodes ahead left, their events came together
	}
	if ev.Type == zk.EventNodeDeleted && w.i == 1 && w.own.armed() {
		return stepGrant
	}
	return stepList
}

// aheadEvent handles the event of the watch on the node before the
// predecessor, usually its holder's release: the predecessor may hold the
// lock now. Listing now, while it does, takes that round trip off the
// next hand-off, whose deletion is then the grant. done false means keep
// awaiting.
func (w *waiter) aheadEvent(ctx context.Context, ev zk.Event) (s step, done bool, err error) {
	w.ppWatch = nil
	if ev.Type == zk.EventNodeDeleted && w.i == 2 && w.own.armed() {
		// It and the predecessor were the only nodes ahead at the
		// listing: the predecessor heads the queue, no listing needed.
		w.i = 1
		return 0, false, nil
	}
	c, err := w.list(ctx)
	if err != nil {
		return stepList, true, nil // handled by the listing in run
	}
	w.answered()
	j, pred, pp := position(c, w.name)
	if j <= 0 || pred != w.pred {
		w.children, w.listed = c, true // the predecessor left too
		return stepList, true, nil
	}
	w.i = j
	if pp != "" && w.b.watchAhead {
		w.ppWatch = w.b.watchBefore(ctx, w.keyPath+"/"+pp)
	}
	if w.i == 1 && w.own == nil {
		if s, err := w.readOwn(ctx, stepAwait); err != nil || s != stepAwait {
			return s, true, err
		}
	}
	return 0, false, nil
}

type statResult struct {
	exists bool
	stat   *zk.Stat
	watch  <-chan zk.Event
}

// watchBefore watches the node at path, ahead of a waiter's predecessor:
// a node already gone yields a deletion event at once; a failed request,
// no watch (nil: only the shortcut is lost).
func (b *Backend) watchBefore(ctx context.Context, path string) <-chan zk.Event {
	ch, err := b.watchNode(ctx, path)
	if errors.Is(err, zk.ErrNoNode) {
		gone := make(chan zk.Event, 1)
		gone <- zk.Event{Type: zk.EventNodeDeleted, Path: path}
		return gone
	}
	return ch
}

// watchOwn reads the Stat of our lock node at path and sets an existence
// watch on it (ExistsW), bounded by ctx.
func (b *Backend) watchOwn(ctx context.Context, path string) (statResult, error) {
	return await(ctx, func() (statResult, error) {
		ok, st, ch, err := b.conn.ExistsW(path)
		return statResult{exists: ok, stat: st, watch: ch}, err
	})
}

// watchNode sets a data watch on the node at path (GetW), bounded by ctx.
// It fails with zk.ErrNoNode when the node does not exist.
func (b *Backend) watchNode(ctx context.Context, path string) (<-chan zk.Event, error) {
	return await(ctx, func() (<-chan zk.Event, error) {
		_, _, ch, err := b.conn.GetW(path)
		return ch, err
	})
}

// deleted reports, without waiting, whether ch holds a deletion event. It
// takes any event there is (the caller lists again on anything else).
func deleted(ch <-chan zk.Event) bool {
	select {
	case ev := <-ch:
		return ev.Type == zk.EventNodeDeleted
	default:
		return false
	}
}

// ch returns the watch channel, nil (blocking forever) when there is none.
func (s *statResult) ch() <-chan zk.Event {
	if s == nil {
		return nil
	}
	return s.watch
}

// armed reports whether the watch is set and has not fired. A fired watch
// is dropped: a deletion makes the caller list again and find the node
// gone; anything else just ends the watch.
func (s *statResult) armed() bool {
	if s == nil || s.watch == nil {
		return false
	}
	select {
	case <-s.watch:
		s.watch = nil
		return false
	default:
		return true
	}
}
