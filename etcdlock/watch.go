package etcdlock

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// held is a lock entry granted through this Backend (one per etcd key; a
// reentrant owner's nested holds share it).
type held struct {
	name  string
	key   string
	token string
	fence int64
	lease *leaseState

	// Guarded by Backend.mu.
	claims    int   // holds granted here and not yet released
	count     int   // the count last read or written in the entry's value
	mod       int64 // the entry's mod revision at that read or write
	lost      error // set once the entry is known gone
	releasing bool  // a Release that may delete the entry is in flight
	regs      map[uint64]func(error)
	nextReg   uint64
	wch       clientv3.WatchChan
	wcancel   context.CancelFunc
	wtimer    *time.Timer // starts the watch lossWatchDelay after the grant
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
// entry was seen to exist) lossWatchDelay later.
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
	h := b.held[name]
	if h != nil && h.fence != fence {
		// An earlier incarnation of the same owner's entry: it is gone.
		lost = b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q was deleted and taken again: %w", key, dlock.ErrNotHeld))
		delete(b.held, name)
		h = nil
	}
	if h == nil {
		h = &held{name: name, key: key, token: token, fence: fence, lease: ls, regs: make(map[uint64]func(error))}
		b.held[name] = h
		h.wtimer = time.AfterFunc(lossWatchDelay, func() {
			b.mu.Lock()
			if b.held[name] != h || h.lost != nil || h.wtimer == nil || b.closed {
				b.mu.Unlock()
				return
			}
			h.wtimer = nil
			b.wg.Add(1)
			b.mu.Unlock()
			defer b.wg.Done()
			b.startWatch(h, from)
		})
	}
	h.claims++
	if mod >= h.mod {
		h.count, h.mod = count, mod
	}
}

// startWatch starts the deletion watch of h, served by the Backend's one
// loss goroutine. It is called without b.mu: Watch returns only once the
// server acknowledged the watch (or h's watch was stopped meanwhile).
func (b *Backend) startWatch(h *held, from int64) {
	b.mu.Lock()
	if b.closed || b.held[h.name] != h || h.lost != nil || h.wcancel != nil {
		b.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(b.ctx)
	h.wcancel = cancel
	b.mu.Unlock()
	wch := b.cli.Watch(ctx, h.name, clientv3.WithRev(from), clientv3.WithFilterPut())
	b.mu.Lock()
	defer b.mu.Unlock()
	if ctx.Err() != nil {
		return // stopped meanwhile (released, lost or closed)
	}
	h.wch = wch
	if !b.looping {
		b.looping = true
		b.wg.Add(1)
		go b.lossLoop()
	}
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// stopWatchLocked ends h's watch. b.mu must be held.
func (b *Backend) stopWatchLocked(h *held) {
	if h.wtimer != nil {
		h.wtimer.Stop()
		h.wtimer = nil
	}
	if h.wcancel != nil {
		h.wcancel()
		h.wcancel = nil
		h.wch = nil
		select {
		case b.kick <- struct{}{}:
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
	for id, fn := range h.regs {
		l = append(l, loss{fn, cause})
		delete(h.regs, id)
	}
	return l
}

// maxSelectWatches bounds the cases of one reflect.Select (Go allows at
// most 65,536). With more held locks, each round serves a random subset
// (map order); a watch not served yet keeps its event buffered, and a
// loss is still found by the next renewal at the latest.
const maxSelectWatches = 60000

// lossLoop is the Backend's one goroutine serving every held entry's
// deletion watch. Each watch is its own etcd watcher on one shared gRPC
// stream; this goroutine selects over all their channels at once
// (reflect.Select), so holding many locks costs no goroutine per lock
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
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(b.kick)})
		for _, h := range b.held { // map order: a different subset each round
			if h.wch != nil && len(hs) < maxSelectWatches {
				hs = append(hs, h)
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(h.wch)})
			}
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
			if ch := cases[i].Chan.Interface().(clientv3.WatchChan); h.wch == ch {
				h.wcancel()
				h.wch, h.wcancel = nil, nil
				if b.held[h.name] == h && h.lost == nil && !b.closed {
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
	if h.wch != ch || b.held[h.name] != h {
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
					if b.held[h.name] == h {
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
			if b.held[h.name] == h && h.lost == nil && h.wcancel == nil {
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
// error matching dlock.ErrNotHeld, when the lock's entry is deleted (its
// lease expired or was revoked, or someone deleted the key) or when a
// keep-alive finds the lease gone. If the lock is not held through this
// Backend (already lost), fn is called before NotifyLoss returns.
//
// When the last registration of a lock is stopped while the Backend still
// holds the lock (the Client gave the lease up as lost without releasing
// it, say after renewals timed out), the Backend deletes the entry in the
// background, so the shared lease, still renewed for other locks, does not
// keep it alive.
func (b *Backend) NotifyLoss(r dlock.Request, fn func(cause error)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	b.mu.Lock()
	h := b.held[b.nameOfLocked(r.Key, r.Token)]
	switch {
	case h == nil || h.fence != fenceRev(r.Fence):
		b.mu.Unlock()
		fn(fmt.Errorf("etcdlock: lock %q is not held by this owner: %w", r.Key, dlock.ErrNotHeld))
		return func() {}
	case h.lost != nil:
		cause := h.lost
		b.mu.Unlock()
		fn(cause)
		return func() {}
	}
	id := h.nextReg
	h.nextReg++
	h.regs[id] = fn
	b.mu.Unlock()
	var done bool
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if done {
			return
		}
		done = true
		delete(h.regs, id)
		if len(h.regs) > 0 || b.held[h.name] != h {
			return
		}
		if h.lost == nil && h.claims > 0 && !h.releasing {
			// Given up without Release: take the entry off the server.
			b.orphanLocked(h.name, h.fence, h.claims)
			b.sweepLocked()
		}
		b.stopWatchLocked(h)
		delete(b.held, h.name)
		b.unclaimLocked(h.key, h.token, h.name)
	}
}
