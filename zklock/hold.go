package zklock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
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
	watch     <-chan zk.Event // existence watch on path; nil until set, and once fired
	armAt     time.Time       // when the event loop sets the watch (zero: it does not)
	arming    bool            // the event loop is setting the watch
	regs      map[uint64]func(error)
	releasing bool // Release is deleting the node: its deletion is no loss
}

type holdKey struct{ key, token string }

func (h *hold) goneErr() error {
	return fmt.Errorf("zklock: lock node %s is gone: %w", h.path, dlock.ErrNotHeld)
}

// lookup returns the hold r refers to, or nil.
func (b *Backend) lookup(r dlock.Request) *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.holds[holdKey{r.Key, r.Token}]
	if h == nil || (r.Fence != 0 && r.Fence != h.fence) {
		return nil
	}
	return h
}

func notHeld(key string) error {
	return fmt.Errorf("zklock: %q: %w", key, dlock.ErrNotHeld)
}

// Refresh implements dlock.Backend. ZooKeeper keeps a lock node as long
// as its session lives, and the connection's heartbeats keep the session
// alive, so Refresh extends nothing: it proves, with a sync and a read of
// the node (two round trips), that the node still exists and belongs to
// this session, which the server then keeps for at least one session
// timeout after the read. It returns an error matching dlock.ErrNotHeld
// when the node is gone (and reports the loss to NotifyLoss callbacks),
// and one matching dlock.ErrInvalidTTL when r.TTL exceeds the session
// timeout.
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	return b.RefreshMany(ctx, []dlock.Request{r})[0]
}

// RefreshMany implements dlock.BatchRefresher: one sync, then the reads
// of every node pipelined on the connection (one round trip for all).
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
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return errs
	}
	// The sync makes the reads below see everything the leader had
	// committed when it was sent (a follower may lag), such as the
	// deletion of our session's nodes at its expiry.
	if _, err := await(ctx, func() (string, error) { return b.conn.Sync("/") }); err != nil {
		for _, i := range todo {
			errs[i] = zkErr("refresh", rs[i].Key, err)
		}
		return errs
	}
	check := func(i int) {
		errs[i] = zkErr("refresh", rs[i].Key, b.check(ctx, hs[i]))
	}
	if len(todo) == 1 {
		check(todo[0])
		return errs
	}
	var wg sync.WaitGroup
	for _, i := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			check(i)
		}()
	}
	wg.Wait()
	return errs
}

// check reads h's node: nil when it exists in h's session, ErrNotHeld
// (after reporting the loss) when it does not. A hold whose watch has
// fired without loss is watched again.
func (b *Backend) check(ctx context.Context, h *hold) error {
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

// setWatch records the existence watch set on h's node, for the event
// loop to wait on.
func (b *Backend) setWatch(h *hold, ch <-chan zk.Event) {
	b.mu.Lock()
	ok := b.holds[h.key] == h && h.watch == nil && ch != nil
	if ok {
		h.watch, h.armAt = ch, time.Time{}
	}
	b.mu.Unlock()
	if ok {
		b.kickLoop()
	}
}

// Release implements dlock.Backend. A reentrant hold with a count above
// one is decremented locally. The last hold deletes the node, which can
// only be this acquisition's own (its name carries a random guid and a
// sequence number), so any version is deleted. It returns an error
// matching dlock.ErrNotHeld when r.Token holds no lock on r.Key through
// this Backend (with r.Fence, when set, as the fence) or the node was
// already gone. When the server does not answer, the hold is forgotten
// anyway and the node is deleted in the background; the error is
// returned.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if b.err != nil {
		return b.err
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

// NotifyLoss implements dlock.LossNotifier: fn is called once, when the
// lock node is deleted by anyone but Release, when the session expires or
// the connection is closed (reported by the node's watch, on the Backend's
// event goroutine), or when Refresh or Close finds the node gone (on
// their goroutine); the cause matches dlock.ErrNotHeld.
// A disconnection alone is no loss: the session may resume (the Client's
// Expires covers the time without an answer). If r holds nothing here, fn
// is called before NotifyLoss returns.
//
// stop must be called when the lease ends. When the last lease on a hold
// ends by stop without having been released (the Client declared it lost
// because renewals went unanswered until it could have expired), the node
// is deleted in the background: a lock its holder has given up must not
// stay in the queue for as long as the session lives.
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
	h.regs[id] = fn
	b.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { b.unregister(h, id) }) }
}

func (b *Backend) unregister(h *hold, id uint64) {
	b.mu.Lock()
	if _, ok := h.regs[id]; !ok {
		b.mu.Unlock()
		return
	}
	delete(h.regs, id)
	orphan := len(h.regs) == 0 && b.holds[h.key] == h && !h.releasing
	if orphan {
		b.forgetLocked(h)
		h.releasing = true
	}
	b.mu.Unlock()
	if orphan {
		b.reap(h.path, h.session)
	}
}

// loseHold forgets h and calls its loss callbacks with cause, once.
func (b *Backend) loseHold(h *hold, cause error) {
	b.mu.Lock()
	b.forgetLocked(h)
	fns := h.regs
	h.regs = make(map[uint64]func(error))
	b.mu.Unlock()
	for _, fn := range fns {
		fn(cause)
	}
}

// startLoopLocked starts the event loop if it is not running. b.mu must
// be held.
func (b *Backend) startLoopLocked() {
	if b.looping || b.closed {
		return
	}
	b.looping = true
	b.wg.Add(1)
	go b.loop()
}

func (b *Backend) kickLoop() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// forgetLocked drops h from the registry. b.mu must be held.
func (b *Backend) forgetLocked(h *hold) {
	if b.holds[h.key] == h {
		delete(b.holds, h.key)
	}
}

// watchDelay is how long a hold granted without a watch on its node goes
// without one: the event loop then sets it. Most holds granted to a
// waiter that was not second in line, or to an uncontended acquisition,
// end sooner, and skipping their watch saves a round trip per
// acquisition. A deletion within that time is still found by Release
// (ErrNotHeld: the lease ends lost), Refresh, or the setting of the watch.
const watchDelay = 100 * time.Millisecond

// loop is the Backend's one event goroutine: it waits on the existence
// watch of every held node at once (go-zookeeper gives each watch its own
// channel) and turns what they report into losses, and sets the watches
// of holds that have none after watchDelay. It runs from the first grant
// until Close.
func (b *Backend) loop() {
	defer b.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(b.ctx.Done())},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(b.kick)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)},
	}
	const fixed = 3
	var hs, due []*hold
	for {
		cases, hs, due = cases[:fixed], hs[:0], due[:0]
		now := time.Now()
		var next time.Time
		b.mu.Lock()
		for _, h := range b.holds {
			switch {
			case h.watch != nil:
				// Go allows at most 65,536 select cases: with more held locks,
				// each round serves a random subset (map order); a watch not
				// served yet keeps its event, and the next Refresh finds a loss
				// at the latest.
				if len(hs) < maxSelectWatches {
					cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(h.watch)})
					hs = append(hs, h)
				}
			case h.armAt.IsZero() || h.arming:
			case !now.Before(h.armAt):
				h.arming = true
				due = append(due, h)
			case next.IsZero() || h.armAt.Before(next):
				next = h.armAt
			}
		}
		b.armPending = !next.IsZero()
		b.mu.Unlock()
		if len(due) > 0 {
			b.arm(slices.Clone(due))
		}
		if next.IsZero() {
			timer.Reset(time.Hour)
		} else {
			timer.Reset(next.Sub(now))
		}
		i, v, ok := reflect.Select(cases)
		switch i {
		case 0:
			return
		case 1, 2:
			continue
		}
		var ev zk.Event
		if ok {
			ev = v.Interface().(zk.Event)
		}
		b.watchFired(hs[i-fixed], ev)
	}
}

// arm sets the watches of hs on a goroutine of its own (the loop must not
// wait for the server). A hold whose node turns out to be gone is lost; on
// an error the next Refresh sets the watch.
func (b *Backend) arm(hs []*hold) {
	b.wg.Add(1) // the loop runs, so Close has not passed wg.Wait
	go func() {
		defer b.wg.Done()
		for _, h := range hs {
			ctx, cancel := context.WithTimeout(b.ctx, max(abandonTimeout, b.SessionTimeout()))
			res, err := await(ctx, func() (statResult, error) {
				ok, st, ch, err := b.conn.ExistsW(h.path)
				return statResult{exists: ok, stat: st, watch: ch}, err
			})
			cancel()
			b.mu.Lock()
			h.arming, h.armAt = false, time.Time{}
			b.mu.Unlock()
			switch {
			case err != nil:
			case !res.exists || res.stat.EphemeralOwner != h.session:
				b.mu.Lock()
				current := b.holds[h.key] == h && !h.releasing
				b.mu.Unlock()
				if current {
					b.loseHold(h, h.goneErr())
				}
			default:
				b.setWatch(h, res.watch)
			}
		}
	}()
}

// watchFired handles the event of h's watch (which fires once).
func (b *Backend) watchFired(h *hold, ev zk.Event) {
	b.mu.Lock()
	h.watch = nil
	current := b.holds[h.key] == h && !h.releasing && !b.closed
	b.mu.Unlock()
	if !current {
		return
	}
	switch {
	case ev.Type == zk.EventNodeDeleted:
		b.loseHold(h, fmt.Errorf("zklock: lock node %s was deleted: %w", h.path, dlock.ErrNotHeld))
	case ev.Type == zk.EventNotWatching && errors.Is(ev.Err, zk.ErrSessionExpired):
		b.loseHold(h, fmt.Errorf("zklock: lock node %s is gone: %w: %w", h.path, dlock.ErrNotHeld, zk.ErrSessionExpired))
	case ev.Type == zk.EventNotWatching:
		// Watches are dropped only when the connection is closed for good
		// (or the session expired, above): the session has ended.
		b.loseHold(h, fmt.Errorf("zklock: lock node %s is gone, connection closed (%v): %w", h.path, ev.Err, dlock.ErrNotHeld))
	default:
		// Someone wrote to the node: no loss. The next Refresh watches it
		// again.
	}
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
		children, err := await(ctx, func() ([]string, error) {
			c, _, err := b.conn.Children(keyPath)
			return c, err
		})
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
// Close stops. A known session that has been replaced ends it: ZooKeeper
// deleted that session's nodes when it expired.
func (b *Backend) background(session int64, attempt func(ctx context.Context) (done bool)) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.wg.Done()
		delay := 50 * time.Millisecond
		for b.ctx.Err() == nil {
			if sid := b.conn.SessionID(); session != 0 && sid != 0 && sid != session {
				return
			}
			ctx, cancel := context.WithTimeout(b.ctx, max(abandonTimeout, b.SessionTimeout()))
			done := attempt(ctx)
			cancel()
			if done || !sleepCtx(b.ctx, delay) {
				return
			}
			delay = backoff(delay)
		}
	}()
}

// maxSelectWatches bounds the watch cases of one reflect.Select.
const maxSelectWatches = 60000
