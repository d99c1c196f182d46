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

// Every held node has an existence watch, which reports its deletion and
// the session's end. A Backend from Connect sets it through the wire
// sniffer (wirewatch.go); the rest of this comment is about a Backend from
// New, whose watches are go-zookeeper's (which gives each a channel of its
// own). The watches are waited on by watch groups: goroutines that each select
// on the watches of up to groupSize holds, so that setting or firing one
// watch costs a select over its group, not over every held lock (one
// select over 100,000 channels costs milliseconds, and it had to be
// rebuilt at every grant). A hold granted without a watch gets one from
// the armer after watchDelay. Refresh answers from the watches too: see
// RefreshMany.

// watchDelay is how long a hold granted without a watch on its node goes
// without one: the armer then sets it. Most holds granted to a waiter that
// was not second in line, or to an uncontended acquisition, end sooner,
// and skipping their watch saves a round trip per acquisition. A deletion
// within that time is still found by Release (ErrNotHeld: the lease ends
// lost), Refresh, or the setting of the watch.
const watchDelay = 100 * time.Millisecond

// groupSize bounds the holds of one watch group.
const groupSize = 256

// armParallel bounds the watches the armer sets at once (requests in
// flight on the connection).
const armParallel = 256

// A watchGroup is a goroutine waiting on the watches of its holds.
type watchGroup struct {
	kick    chan struct{} // the set of watches changed
	holds   []*hold       // b.mu; each with a watch
	inRoomy bool          // b.mu; listed in b.roomy
}

// attachLocked hands h, whose watch is set, to a watch group with room
// (starting one when none has). b.mu must be held.
func (b *Backend) attachLocked(h *hold) {
	if h.group != nil || b.closed {
		return
	}
	var g *watchGroup
	if n := len(b.roomy); n > 0 {
		g = b.roomy[n-1]
	} else {
		g = &watchGroup{kick: make(chan struct{}, 1), inRoomy: true}
		b.roomy = append(b.roomy, g)
		b.wg.Add(1) // not closed: Close has not passed wg.Wait
		go b.runGroup(g)
	}
	g.holds = append(g.holds, h)
	h.group = g
	if len(g.holds) >= groupSize {
		b.roomy = b.roomy[:len(b.roomy)-1]
		g.inRoomy = false
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// detachLocked takes h out of its watch group. The group may still
// select on h's old watch until something else wakes it; an event on it
// is then ignored (watchFired). b.mu must be held.
func (b *Backend) detachLocked(h *hold) {
	g := h.group
	if g == nil {
		return
	}
	h.group = nil
	if i := slices.Index(g.holds, h); i >= 0 {
		last := len(g.holds) - 1
		g.holds[i] = g.holds[last]
		g.holds[last] = nil
		g.holds = g.holds[:last]
	}
	if !g.inRoomy {
		g.inRoomy = true
		b.roomy = append(b.roomy, g)
	}
}

// runGroup waits on the watches of g's holds until Close, and turns what
// they report into losses.
func (b *Backend) runGroup(g *watchGroup) {
	defer b.wg.Done()
	const fixed = 2
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(b.ctx.Done())},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(g.kick)},
	}
	var hs []*hold
	var chs []<-chan zk.Event
	for {
		cases, hs, chs = cases[:fixed], hs[:0], chs[:0]
		b.mu.Lock()
		for _, h := range g.holds {
			if h.watch != nil {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(h.watch)})
				hs, chs = append(hs, h), append(chs, h.watch)
			}
		}
		b.mu.Unlock()
		i, v, ok := reflect.Select(cases)
		switch {
		case i == 0:
			return
		case i == 1:
			continue
		case !ok:
			// Closed without an event for us: Refresh took the event, and
			// has already dropped the watch (see proven).
			continue
		}
		b.watchFired(hs[i-fixed], chs[i-fixed], v.Interface().(zk.Event))
	}
}

// watchFired handles the event of h's watch ch (which fires once), unless
// ch is no longer h's watch.
func (b *Backend) watchFired(h *hold, ch <-chan zk.Event, ev zk.Event) {
	b.mu.Lock()
	if h.watch != ch {
		b.mu.Unlock()
		return
	}
	h.watch = nil
	b.detachLocked(h)
	b.mu.Unlock()
	b.watchEvent(h, ev)
}

// watchEvent turns the event of h's watch, now dropped, into a loss.
func (b *Backend) watchEvent(h *hold, ev zk.Event) {
	b.mu.Lock()
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

// proof is what a hold's watch tells about its node after a sync.
type proof int

const (
	unproven proof = iota // no watch to tell: read the node
	alive                 // the watch is set and has not fired: the node exists
	gone                  // the hold was lost
)

// proven tells, after a sync on the connection has been answered, whether
// h's node still exists in h's session without reading it. ZooKeeper
// sends a watch's event before the reply to any later request of the
// session (the sync makes a follower apply what the leader had committed
// before it answers), and go-zookeeper delivers it to the watch's channel
// before it hands out that reply; a session that expired has its watches
// dropped with an event before a new session is opened. So a watch set on
// the node whose channel is still empty and open proves the node existed
// when the sync was answered. An event found here is handled as the
// watch group would; one the group took already is in hand there, so the
// node is read instead.
func (b *Backend) proven(h *hold, session int64) proof {
	b.mu.Lock()
	if b.holds[h.key] != h {
		b.mu.Unlock()
		return gone
	}
	if b.wired() {
		// The sniffer clears watchGen when an event for the node arrives,
		// before go-zookeeper reads the sync's reply (wirewatch.go).
		watched := session == h.session && b.watchedLocked(h)
		b.mu.Unlock()
		if watched {
			return alive
		}
		return unproven
	}
	ch := h.watch
	if ch == nil || session != h.session {
		b.mu.Unlock()
		return unproven
	}
	select {
	case ev, ok := <-ch:
		if !ok {
			b.mu.Unlock()
			return unproven
		}
		h.watch = nil
		b.detachLocked(h)
		b.mu.Unlock()
		b.watchEvent(h, ev)
		b.mu.Lock()
		lost := b.holds[h.key] != h
		b.mu.Unlock()
		if lost {
			return gone
		}
		return unproven // the node changed: read it, which watches it again
	default:
		b.mu.Unlock()
		return alive
	}
}

// scheduleArmLocked has the armer set h's watch after watchDelay. b.mu
// must be held.
func (b *Backend) scheduleArmLocked(h *hold) {
	if b.closed || h.queued {
		return
	}
	h.armAt, h.queued = b.since()+watchDelay, true
	b.toArm = append(b.toArm, h) // in armAt order: watchDelay is constant
	b.startArmerLocked()
}

// rearmLocked has the armer set the watches of hs at once (ahead of the
// holds waiting for watchDelay). b.mu must be held.
func (b *Backend) rearmLocked(hs []*hold) {
	if b.closed {
		return
	}
	now := b.since()
	var due []*hold
	for _, h := range hs {
		if !h.queued {
			h.armAt, h.queued = now, true
			due = append(due, h)
		}
	}
	if len(due) == 0 {
		return
	}
	b.toArm = append(due, b.toArm...)
	b.startArmerLocked()
	select {
	case b.armKick <- struct{}{}:
	default:
	}
}

// startArmerLocked starts the armer, or wakes it when its queue was
// empty. b.mu must be held.
func (b *Backend) startArmerLocked() {
	if !b.arming {
		b.arming = true
		b.wg.Add(1)
		go b.armer()
		return
	}
	if len(b.toArm) == 1 {
		select {
		case b.armKick <- struct{}{}:
		default:
		}
	}
}

// armer sets the watches of holds granted without one once they have
// been held for watchDelay, until Close.
func (b *Backend) armer() {
	defer b.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := b.since()
		var due []*hold
		next := time.Duration(-1)
		b.mu.Lock()
		for len(b.toArm) > 0 {
			h := b.toArm[0]
			current := b.holds[h.key] == h && !b.watchedLocked(h) && !h.releasing
			if current && now < h.armAt {
				next = h.armAt
				break
			}
			b.toArm[0] = nil
			b.toArm = b.toArm[1:]
			h.queued = false
			if current {
				due = append(due, h)
			}
		}
		if len(b.toArm) == 0 {
			b.toArm = nil // let the backing array go
		}
		b.mu.Unlock()
		if len(due) > 0 {
			b.arm(due)
			continue
		}
		if next < 0 {
			timer.Reset(time.Hour)
		} else {
			timer.Reset(next - now)
		}
		select {
		case <-b.ctx.Done():
			return
		case <-b.armKick:
		case <-timer.C:
		}
	}
}

// arm sets the watches of hs, up to armParallel at a time (pipelined on
// the connection). A hold whose node turns out to be gone is lost; on an
// error the next Refresh sets the watch.
func (b *Backend) arm(hs []*hold) { inParallel(hs, b.armOne) }

// armOne sets h's watch for arm.
func (b *Backend) armOne(h *hold) {
	ctx, cancel := context.WithTimeout(b.ctx, max(abandonTimeout, b.SessionTimeout()))
	var res statResult
	var err error
	if b.wired() {
		r := b.startWire(h)
		if r == nil {
			// Watched meanwhile, or being read (by Refresh), which
			// watches it: nothing to do.
			cancel()
			return
		}
		res, err = b.readWire(ctx, h, r) // records the watch
	} else {
		res, err = await(ctx, func() (statResult, error) {
			ok, st, ch, err := b.conn.ExistsW(h.path)
			return statResult{exists: ok, stat: st, watch: ch}, err
		})
	}
	cancel()
	switch {
	case err != nil:
	case !res.exists || res.stat.EphemeralOwner != h.session:
		b.mu.Lock()
		current := b.holds[h.key] == h && !h.releasing
		b.mu.Unlock()
		if current {
			b.loseHold(h, h.goneErr())
		}
	case !b.wired():
		b.setWatch(h, res.watch)
	}
}

// inParallel calls f with each of xs, armParallel calls at a time, and
// returns when all have returned.
func inParallel[T any](xs []T, f func(T)) {
	sem := make(chan struct{}, armParallel)
	var wg sync.WaitGroup
	for _, x := range xs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(x)
		}()
	}
	wg.Wait()
}
