package etcdlock

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// holdSet is the entries granted through the Backend and their deletion
// watches. Guarded by Backend.mu.
type holdSet struct {
	byName   map[string]*held   // granted entries by etcd key
	watching map[*held]struct{} // held entries with a deletion watch of their own
	pw       *prefixWatch       // the deletion watch over the prefix, with many held (prefixwatch.go)
	kick     chan struct{}      // wakes lossLoop to select over watching again
	looping  bool               // lossLoop runs
}

// held is a lock entry granted through this Backend (one per etcd key; a
// reentrant owner's nested holds share it).
type held struct {
	name  string
	key   string
	token string
	fence int64

	// Guarded by Backend.mu. Kept small: a Backend may hold 100,000
	// locks (128 bytes each).
	lease     *leaseState // the lease the entry is on (an owner's entry may move to a longer one)
	claims    int32       // holds granted here and not yet released
	count     int32       // the count last read or written in the entry's value
	releasing bool        // a Release that may delete the entry is in flight
	mod       int64       // the entry's mod revision at that read or write
	lost      error       // set once the entry is known gone
	// from: a deletion of the entry at this revision or later ends the
	// hold (the entry was seen to exist at from-1 or later).
	from int64
	regs *lossReg  // NotifyLoss callbacks not fired or stopped (a list: usually one)
	own  *ownWatch // the hold's own deletion watch, unless the prefix watch covers it
}

// ownWatch is a held lock's own deletion watch: pending (timer set) or
// running (cancel set). Guarded by Backend.mu.
type ownWatch struct {
	timer  *time.Timer // starts the watch (lossWatchDelay after the grant)
	ch     clientv3.WatchChan
	cancel context.CancelFunc
}

// lossReg is one NotifyLoss registration, in a list. Guarded by
// Backend.mu.
type lossReg struct {
	fn      func(error)
	next    *lossReg
	stopped bool
}

// loss is one pending loss callback; lossList is fired outside b.mu.
type loss struct {
	fn    func(error)
	cause error
}

type lossList []loss

func (l lossList) fire() {
	for _, x := range l {
		x.fn(x.cause)
	}
}

// addHold records a grant of the entry name created at fence, and starts
// watching it for deletion from revision from (a revision at which the
// entry was seen to exist) lossWatchDelay later, unless the Backend's
// prefix watch covers it (prefixwatch.go).
//
// The delay spares short holds the cost of a watch (creating and
// cancelling one costs the server about as much as a read), which matters
// for hand-off throughput. Nothing is missed: the watch starts at the
// grant's revision, so a deletion in the meantime is replayed at once;
// it is only reported up to lossWatchDelay later. A lease cannot expire
// that early (the grant made sure it is valid for the TTL); only a
// revocation or deletion by someone else can, and the Release of such a
// lock returns dlock.ErrNotHeld regardless.
func (b *Backend) addHold(name, key, token string, fence int64, ls *leaseState, count int, mod, from int64) {
	b.mu.Lock()
	var lost lossList
	defer func() {
		b.mu.Unlock()
		lost.fire()
	}()
	h := b.holds.byName[name]
	if h != nil && h.fence != fence {
		// An earlier incarnation of the same owner's entry: it is gone.
		lost = b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q was deleted and taken again: %w", key, dlock.ErrNotHeld))
		delete(b.holds.byName, name)
		h = nil
	}
	if h == nil {
		h = &held{name: name, key: key, token: token, fence: fence, lease: ls, from: from}
		b.holds.byName[name] = h
		if !b.coveredLocked(h) {
			b.watchLaterLocked(h, from, b.tune.lossWatchDelay)
		}
		b.prefixUpLocked()
	}
	h.claims++
	h.lease = ls // an owner's entry may have moved to a longer lease
	if mod >= h.mod {
		h.setCount(count, mod)
	}
}

// setCount records the hold count read or written at revision mod. A
// count beyond int32 (never written by dlock) is recorded as unknown, so
// that the next change reads it first. b.mu must be held.
func (h *held) setCount(count int, mod int64) {
	if count > math.MaxInt32 {
		count, mod = 0, 0
	}
	h.count, h.mod = int32(count), mod
}

// watchLaterLocked starts h's own deletion watch from revision from,
// after delay. b.mu must be held.
func (b *Backend) watchLaterLocked(h *held, from int64, delay time.Duration) {
	o := &ownWatch{}
	h.own = o
	o.timer = time.AfterFunc(delay, func() {
		b.mu.Lock()
		if b.holds.byName[h.name] != h || h.lost != nil || h.own != o || o.timer == nil || b.closed {
			b.mu.Unlock()
			return
		}
		o.timer = nil
		b.wg.Add(1)
		b.mu.Unlock()
		defer b.wg.Done()
		b.startWatch(h, from)
	})
}

// dropHoldLocked forgets h (released, or given up) and switches back to
// per-lock watches if few locks remain held. b.mu must be held.
func (b *Backend) dropHoldLocked(h *held) {
	b.stopWatchLocked(h)
	delete(b.holds.byName, h.name)
	b.unclaimLocked(h.key, h.token, h.name)
	b.prefixDownLocked()
}

// startWatch starts the deletion watch of h, served by the Backend's one
// loss goroutine. It is called without b.mu: Watch returns only once the
// server acknowledged the watch (or h's watch was stopped meanwhile).
func (b *Backend) startWatch(h *held, from int64) {
	b.mu.Lock()
	o := h.own
	if b.closed || b.holds.byName[h.name] != h || h.lost != nil || (o != nil && (o.cancel != nil || o.timer != nil)) || b.coveredLocked(h) {
		b.mu.Unlock()
		return
	}
	if o == nil {
		o = &ownWatch{}
		h.own = o
	}
	ctx, cancel := context.WithCancel(b.ctx)
	o.cancel = cancel
	b.mu.Unlock()
	wch := b.cli.Watch(ctx, h.name, clientv3.WithRev(from), clientv3.WithFilterPut())
	b.mu.Lock()
	defer b.mu.Unlock()
	if ctx.Err() != nil {
		return // stopped meanwhile (released, lost or closed)
	}
	o.ch = wch
	b.holds.watching[h] = struct{}{}
	b.startLocked(&b.holds.looping, b.lossLoop)
	select {
	case b.holds.kick <- struct{}{}:
	default:
	}
}

// stopWatchLocked ends h's watch. b.mu must be held.
func (b *Backend) stopWatchLocked(h *held) {
	o := h.own
	if o == nil {
		return
	}
	h.own = nil
	if o.timer != nil {
		o.timer.Stop()
	}
	if o.cancel != nil {
		o.cancel()
		delete(b.holds.watching, h)
		select {
		case b.holds.kick <- struct{}{}:
		default:
		}
	}
}

// markLostLocked marks h lost with cause, ends its watch and returns its
// callbacks. b.mu must be held.
func (b *Backend) markLostLocked(h *held, cause error) lossList {
	if h.lost != nil {
		return nil
	}
	h.lost = cause
	b.stopWatchLocked(h)
	var l lossList
	for r := h.regs; r != nil; r = r.next {
		l = append(l, loss{r.fn, cause})
	}
	h.regs = nil
	return l
}

// maxSelectWatches bounds the cases of one reflect.Select (Go allows at
// most 65,536). With more held locks, each round serves a random subset
// (map order); a watch not served yet keeps its event buffered, and a
// loss is still found by the next renewal at the latest.
const maxSelectWatches = 60000

// lossLoop is the Backend's one goroutine serving the held entries' own
// deletion watches (fewer than prefixWatchMin, unless the prefix watch
// failed meanwhile: see prefixwatch.go). Each watch is its own etcd
// watcher on one shared gRPC stream; this goroutine selects over all their
// channels at once (reflect.Select), so it costs no goroutine per lock
// here (the etcd client runs its own per-watcher goroutine regardless).
func (b *Backend) lossLoop() {
	defer b.wg.Done()
	var (
		hs    []*held
		cases []reflect.SelectCase
	)
	for {
		b.mu.Lock()
		hs = hs[:0]
		cases = append(cases[:0],
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(b.ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(b.holds.kick)})
		for h := range b.holds.watching { // map order: a different subset each round
			if len(hs) == maxSelectWatches {
				break
			}
			hs = append(hs, h)
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(h.own.ch)})
		}
		b.mu.Unlock()

		i, v, ok := reflect.Select(cases)
		switch {
		case i == 0:
			return
		case i == 1:
			continue
		}
		h := hs[i-2]
		if !ok {
			// The watch ended: cancelled by us, or the client is closing.
			b.mu.Lock()
			if o := h.own; o != nil && o.ch == cases[i].Chan.Interface().(clientv3.WatchChan) {
				o.cancel()
				h.own = nil
				delete(b.holds.watching, h)
				if b.holds.byName[h.name] == h && h.lost == nil && !b.closed {
					b.recheck(h)
				}
			}
			b.mu.Unlock()
			continue
		}
		resp := v.Interface().(clientv3.WatchResponse)
		b.onWatch(h, cases[i].Chan.Interface().(clientv3.WatchChan), resp)
	}
}

// onWatch handles one response of h's deletion watch.
func (b *Backend) onWatch(h *held, ch clientv3.WatchChan, resp clientv3.WatchResponse) {
	var deleted *clientv3.Event
	for _, ev := range resp.Events {
		if ev.Type == mvccpb.DELETE {
			deleted = ev
			break
		}
	}
	b.mu.Lock()
	if h.own == nil || h.own.ch != ch || b.holds.byName[h.name] != h {
		b.mu.Unlock()
		return
	}
	var lost lossList
	switch {
	case deleted != nil && !h.releasing:
		lost = b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q: key %s deleted at revision %d (lease expired or revoked, or key deleted): %w",
			h.key, h.name, deleted.Kv.ModRevision, dlock.ErrNotHeld))
	case deleted != nil:
		b.stopWatchLocked(h) // our own Release deleted it
	case resp.Canceled || resp.Err() != nil:
		// Compacted past our start revision, or cancelled by the server:
		// find out with a read and watch again.
		b.stopWatchLocked(h)
		b.recheck(h)
	}
	b.mu.Unlock()
	lost.fire()
}

// recheck reads h's entry on a goroutine of its own and either reports it
// lost or watches it again from the revision read. b.mu must be held.
func (b *Backend) recheck(h *held) {
	if b.closed {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for b.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(b.ctx, cleanupTimeout)
			resp, err := b.cli.Get(ctx, h.name)
			cancel()
			if err != nil {
				if b.cli.Ctx().Err() != nil {
					// The etcd client was closed: nothing can be renewed.
					b.mu.Lock()
					var lost lossList
					if b.holds.byName[h.name] == h {
						lost = b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q: etcd client closed: %w", h.key, dlock.ErrNotHeld))
					}
					b.mu.Unlock()
					lost.fire()
					return
				}
				select {
				case <-b.ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			b.mu.Lock()
			var lost lossList
			again := false
			if b.holds.byName[h.name] == h && h.lost == nil && h.own == nil {
				if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != h.fence {
					if !h.releasing {
						lost = b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q: key %s is gone: %w", h.key, h.name, dlock.ErrNotHeld))
					}
				} else {
					again = true
				}
			}
			b.mu.Unlock()
			lost.fire()
			if again {
				b.startWatch(h, resp.Header.Revision+1)
			}
			return
		}
	}()
}

// NotifyLoss implements dlock.LossNotifier: fn is called once, with an
// error matching dlock.ErrNotHeld, when the lock's entry or its lease is
// found gone; at once if the lock is not held through b. Stopping the
// last registration of a lock not released deletes its entry.
func (b *Backend) NotifyLoss(r dlock.Request, fn func(cause error)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	b.mu.Lock()
	h := b.heldLocked(r.Key, r.Token)
	switch {
	case h == nil || h.fence != fenceRev(r.Fence) || b.wrongKindLocked(r):
		b.mu.Unlock()
		fn(fmt.Errorf("etcdlock: lock %q is not held by this owner: %w", r.Key, dlock.ErrNotHeld))
		return func() {}
	case h.lost != nil:
		cause := h.lost
		b.mu.Unlock()
		fn(cause)
		return func() {}
	}
	reg := &lossReg{fn: fn, next: h.regs}
	h.regs = reg
	b.mu.Unlock()
	return func() { b.stopNotify(h, reg) }
}

// stopNotify ends the NotifyLoss registration reg of h (once; later calls
// do nothing). The last one ends h's hold.
func (b *Backend) stopNotify(h *held, reg *lossReg) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if reg.stopped {
		return
	}
	reg.stopped = true
	for p := &h.regs; *p != nil; p = &(*p).next {
		if *p == reg { // not fired yet
			*p = reg.next
			break
		}
	}
	if h.regs != nil || b.holds.byName[h.name] != h {
		return
	}
	if h.lost == nil && h.claims > 0 && !h.releasing {
		// Given up without Release: take the entry off the server.
		b.orphanLocked(h.name, h.fence, int(h.claims))
		b.sweepLocked()
	}
	b.dropHoldLocked(h)
}
