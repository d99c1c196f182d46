package zklock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// A hold is a lock node this Backend holds (first in its queue), with the
// reentrant count and the NotifyLoss registrations of the leases on it.
// Reentrancy is local to the Backend, that is to its session: the same
// owner token through another Backend queues like anyone else.
type hold struct {
	key       holdKey
	path      string
	fence     uint64
	session   int64 // the node's ephemeral owner
	count     int
	watch     <-chan zk.Event // New: existence watch on path; nil until set, and once fired
	group     *watchGroup     // New: the group waiting on watch, nil when none
	armAt     time.Duration   // when the armer sets the watch (when queued), in b.since time
	regs      []reg           // usually one: a slice costs less than a map per hold
	watchGen  uint32          // Connect: the connection the wire watch is on, 0: none (wirewatch.go)
	queued    bool            // in b.toArm
	releasing bool            // Release is deleting the node: its deletion is no loss
	kind      dlock.Kind      // what the node grants: a lock, a permit or a read hold
	pending   int             // grants (first or re-entry) whose lease has not registered yet
	orphanGen uint32          // bumped by every registration and Refresh: cancels a scheduled reap
}

type holdKey struct{ key, token string }

// reg is a NotifyLoss registration.
type reg struct {
	id uint64
	fn func(error)
}

func (h *hold) goneErr() error {
	return fmt.Errorf("zklock: lock node %s is gone: %w", h.path, dlock.ErrNotHeld)
}

// lookup returns the hold r refers to, or nil.
func (b *Backend) lookup(r dlock.Request) *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.holds[holdKey{r.Key, r.Token}]
	if h == nil || (r.Fence != 0 && r.Fence != h.fence) || r.Kind != h.kind {
		return nil
	}
	return h
}

// touch cancels a reap scheduled for h: a lease refreshes it.
func (b *Backend) touch(h *hold) {
	b.mu.Lock()
	h.orphanGen++
	b.mu.Unlock()
}

func notHeld(key string) error {
	return fmt.Errorf("zklock: %q: %w", key, dlock.ErrNotHeld)
}

// Refresh implements dlock.Backend: it proves, with one sync, that the
// node of r's grant (token and fence) still exists in this session, which
// the server then keeps for at least the session timeout. It returns an
// error matching dlock.ErrNotHeld when the node is gone, and one matching
// dlock.ErrInvalidTTL for a TTL outside [MinTTL, SessionTimeout].
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	return b.RefreshMany(ctx, []dlock.Request{r})[0]
}

// RefreshMany implements dlock.BatchRefresher: Refresh for every request,
// with one sync for the whole batch; nodes without a watch are read too,
// pipelined in one more round trip.
func (b *Backend) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	errs := make([]error, len(rs))
	if err := b.usable(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	hs := make([]*hold, len(rs))
	var todo []int
	for i, r := range rs {
		if err := b.checkTTL(ctx, r.TTL); err != nil {
			errs[i] = err
			continue
		}
		if hs[i] = b.lookup(r); hs[i] == nil {
			errs[i] = notHeld(r.Key)
			continue
		}
		b.touch(hs[i])
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return errs
	}
	// The sync makes what follows see everything the leader had committed
	// when it was sent (a follower may lag), such as the deletion of our
	// session's nodes at its expiry: their watches' events arrive before
	// its reply.
	if _, err := await(ctx, func() (string, error) { return b.conn.Sync("/") }); err != nil {
		for _, i := range todo {
			errs[i] = zkErr("refresh", rs[i].Key, err)
		}
		return errs
	}
	session := b.conn.SessionID() // the session that answered, or a later one
	var read []int
	for _, i := range todo {
		switch b.proven(hs[i], session) {
		case alive:
		case gone:
			errs[i] = zkErr("refresh", rs[i].Key, hs[i].goneErr())
		default:
			read = append(read, i)
		}
	}
	check := func(i int) {
		errs[i] = zkErr("refresh", rs[i].Key, b.check(ctx, hs[i]))
	}
	if len(read) == 1 {
		check(read[0])
		return errs
	}
	inParallel(read, check)
	return errs
}

// check reads h's node: nil when it exists in h's session, ErrNotHeld
// (after reporting the loss) when it does not. A hold whose watch has
// fired without loss is watched again.
func (b *Backend) check(ctx context.Context, h *hold) error {
	if b.wired() {
		res, err := b.readWire(ctx, h, b.startWire(h))
		switch {
		case err != nil:
			return err
		case !res.exists || res.stat.EphemeralOwner != h.session:
			err := h.goneErr()
			b.loseHold(h, err)
			return err
		}
		return nil
	}
	b.mu.Lock()
	rearm := h.watch == nil
	b.mu.Unlock()
	res, err := await(ctx, func() (statResult, error) {
		if rearm {
			ok, st, ch, err := b.conn.ExistsW(h.path)
			return statResult{exists: ok, stat: st, watch: ch}, err
		}
		ok, st, err := b.conn.Exists(h.path)
		return statResult{exists: ok, stat: st}, err
	})
	if err != nil {
		return err
	}
	if !res.exists || res.stat.EphemeralOwner != h.session {
		err := h.goneErr()
		b.loseHold(h, err)
		return err
	}
	if rearm {
		b.setWatch(h, res.watch)
	}
	return nil
}

// setWatch records the existence watch set on h's node, for a watch
// group to wait on.
func (b *Backend) setWatch(h *hold, ch <-chan zk.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holds[h.key] == h && h.watch == nil && ch != nil && !b.closed {
		h.watch = ch
		b.attachLocked(h)
	}
}

// Release implements dlock.Backend: it gives up one hold of r's grant
// (token and fence) and deletes the node with the last one. It returns an
// error matching dlock.ErrNotHeld when r holds nothing here or the node
// was already gone; when the server does not answer, the node is deleted
// in the background and the error returned.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if b.err != nil {
		return b.err
	}
	if r.Waiting && r.Fence == 0 {
		// A writer that stopped waiting (see dlock.Request.Waiting): its
		// node left the queue when its wait ended.
		return notHeld(r.Key)
	}
	h := b.lookup(r)
	if h == nil {
		return notHeld(r.Key)
	}
	b.mu.Lock()
	if b.holds[h.key] != h {
		b.mu.Unlock()
		return notHeld(r.Key)
	}
	if h.count > 1 {
		h.count--
		h.pending = max(h.pending-1, 0) // perhaps a grant its Client gave back
		if b.orphanLocked(h) {
			b.scheduleReapLocked(h) // the other holds' leases ended without Release
		}
		b.mu.Unlock()
		return nil
	}
	h.releasing = true
	b.forgetLocked(h)
	b.mu.Unlock()

	err := b.delete(ctx, h.path)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrNoNode):
		return fmt.Errorf("zklock: release %q: lock node %s was already gone: %w", r.Key, h.path, dlock.ErrNotHeld)
	}
	b.reap(h.path, h.session)
	return fmt.Errorf("zklock: release %q (the lock node is deleted in the background): %w", r.Key, err)
}

// NotifyLoss implements dlock.LossNotifier: fn is called once, with an
// error matching dlock.ErrNotHeld, when r's node is deleted by anyone but
// Release, its session ends or Refresh finds it gone (at once when r holds
// nothing here). stop must be called when the lease ends; a hold whose
// leases all ended without Release is deleted (see the package
// documentation, Lost leases).
func (b *Backend) NotifyLoss(r dlock.Request, fn func(cause error)) (stop func()) {
	h := b.lookup(r)
	b.mu.Lock()
	if h == nil || b.holds[h.key] != h {
		b.mu.Unlock()
		fn(notHeld(r.Key))
		return func() {}
	}
	b.regID++
	id := b.regID
	h.regs = append(h.regs, reg{id, fn})
	h.pending = max(h.pending-1, 0)
	h.orphanGen++
	b.mu.Unlock()
	return func() { b.unregister(h, id) } // a second call finds id gone
}

func (b *Backend) unregister(h *hold, id uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.IndexFunc(h.regs, func(r reg) bool { return r.id == id })
	if i < 0 {
		return
	}
	h.regs = slices.Delete(h.regs, i, i+1)
	if b.orphanLocked(h) {
		b.scheduleReapLocked(h)
	}
}

// reapGrace is how long a hold whose last lease ended without Release
// keeps its node before it is deleted: a lease of the same grant that
// registers, or a Refresh of it, within that time keeps the hold.
const reapGrace = 250 * time.Millisecond

// orphanLocked reports whether h is held with no lease on it: no
// registration, and no grant whose lease has yet to register. b.mu must
// be held.
func (b *Backend) orphanLocked(h *hold) bool {
	return len(h.regs) == 0 && h.pending == 0 && b.holds[h.key] == h && !h.releasing && !b.closed
}

// scheduleReapLocked deletes h's node after reapGrace, unless a lease
// registers for h or refreshes it meanwhile. b.mu must be held.
func (b *Backend) scheduleReapLocked(h *hold) {
	h.orphanGen++
	gen := h.orphanGen
	b.wg.Add(1) // not closed: orphanLocked checked it
	go func() {
		defer b.wg.Done()
		if !sleepCtx(b.ctx, reapGrace) {
			return
		}
		b.mu.Lock()
		orphan := b.orphanLocked(h) && h.orphanGen == gen
		if orphan {
			b.forgetLocked(h)
			h.releasing = true
		} else {
			b.reapsKept++
		}
		b.mu.Unlock()
		if orphan {
			b.reap(h.path, h.session)
		}
	}()
}

// loseHold forgets h and calls its loss callbacks with cause, once.
func (b *Backend) loseHold(h *hold, cause error) {
	b.mu.Lock()
	regs := b.takeLocked(h)
	b.mu.Unlock()
	for _, r := range regs {
		r.fn(cause)
	}
}

// takeLocked forgets h and returns its loss callbacks, which it drops
// (so that they are called once). b.mu must be held.
func (b *Backend) takeLocked(h *hold) []reg {
	b.forgetLocked(h)
	regs := h.regs
	h.regs = nil
	return regs
}

// forgetLocked drops h from the registry and from its watch group.
// b.mu must be held.
func (b *Backend) forgetLocked(h *hold) {
	if b.holds[h.key] == h {
		delete(b.holds, h.key)
	}
	if b.byPath[h.path] == h {
		delete(b.byPath, h.path)
	}
	b.detachLocked(h)
}

// reap deletes the lock node at path in the background, retrying until
// it is gone, its session (when known) has ended, or the Backend is
// closed.
func (b *Backend) reap(path string, session int64) {
	b.background(session, func(ctx context.Context) bool {
		err := b.delete(ctx, path)
		return err == nil || errors.Is(err, zk.ErrNoNode)
	})
}

// reapCreate deletes, in the background, the node an abandoned create of
// guid in keyPath may have made: it waits for the create's outcome when
// pending is not nil, then deletes the node it made or, when the reply
// was lost, every node whose name carries guid.
func (b *Backend) reapCreate(pending <-chan result[created], keyPath, guid string) {
	// attempt runs on one goroutine at a time: no locking needed.
	var path string
	find := pending == nil
	b.background(0, func(ctx context.Context) bool {
		if pending != nil {
			select {
			case r := <-pending:
				pending = nil
				switch {
				case r.err == nil:
					path = r.v.path
				case transient(r.err):
					find = true
				}
			case <-ctx.Done():
				return false // still in flight: wait again
			}
		}
		switch {
		case path != "":
			err := b.delete(ctx, path)
			return err == nil || errors.Is(err, zk.ErrNoNode)
		case !find:
			return true // the create failed: nothing was made
		}
		children, err := await(ctx, func() ([]string, error) { return b.syncedChildren(keyPath) })
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return true
		case err != nil:
			return false
		}
		name := findProtected(children, guid)
		if name == "" {
			return true
		}
		path = keyPath + "/" + name
		err = b.delete(ctx, path)
		return err == nil || errors.Is(err, zk.ErrNoNode)
	})
}

// background runs attempt until it reports done, with a growing pause
// between attempts (each bounded by abandonTimeout), on a goroutine that
// Close stops (see Close). A known session that has been replaced ends
// it: ZooKeeper deleted that session's nodes when it expired.
func (b *Backend) background(session int64, attempt func(ctx context.Context) (done bool)) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.cleanWG.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.cleanWG.Done()
		delay := 50 * time.Millisecond
		for b.cleanCtx.Err() == nil {
			if sid := b.conn.SessionID(); session != 0 && sid != 0 && sid != session {
				return
			}
			ctx, cancel := context.WithTimeout(b.cleanCtx, max(abandonTimeout, b.SessionTimeout()))
			done := attempt(ctx)
			cancel()
			if done || !sleepCtx(b.cleanCtx, delay) {
				return
			}
			delay = backoff(delay)
		}
	}()
}
