package zklock

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// A Backend made by Connect watches its held nodes without go-zookeeper's
// watch bookkeeping, which costs a channel and a map entry per watch
// (about 270 bytes, with a goroutine of ours selecting on the channel
// about 500). Its reads of a held node are plain Exists calls whose watch
// flag the wire sniffer sets as the request leaves (wire.go), so the
// server keeps a watch that go-zookeeper does not know of; the sniffer
// reads the watch's event off the wire (go-zookeeper, finding no watcher
// of its own for the path, ignores it) and routes it to the hold by path
// (b.byPath). This is the only byte the sniffer ever changes.
//
// Such a watch lives on one TCP connection: go-zookeeper re-registers only
// its own watches on a new one. So each watch is recorded with the
// connection it was set on (the count of connections dialled, b.gen): a
// hold is watched while that is the current connection. A new connection
// of the same session has the armer watch every hold again (a read per
// hold, which also finds the nodes deleted meanwhile — where
// go-zookeeper's own watches cost one SetWatches request per 128 KiB of
// paths); a new session, or a session found expired, loses every hold of
// the old one at once; the close of the connection for good
// (go-zookeeper then closes its event channel, which drainEvents reads)
// loses them all. RefreshMany's proof (see proven) holds as with
// go-zookeeper's watches: the sniffer handles an event before
// go-zookeeper reads the reply to any later request.
//
// Loss callbacks run on a goroutine of their own, never on go-zookeeper's
// receive loop.

// armWire is a read of a held node in flight whose request the sniffer
// may set the watch flag of.
type armWire struct {
	flipped bool   // the request went out with the watch flag set
	gen     uint32 // on connection gen
	fired   bool   // an event for the path arrived since
}

// wired reports whether b watches its held nodes through the sniffer.
func (b *Backend) wired() bool { return b.owned }

// watchedLocked reports whether h's node is watched now. b.mu must be
// held.
func (b *Backend) watchedLocked(h *hold) bool {
	if b.wired() {
		return h.watchGen != 0 && h.watchGen == b.gen.Load()
	}
	return h.watch != nil
}

// startWire registers a read of h's node that the sniffer sets the watch
// flag of, when h is not watched on the current connection and no such
// read is in flight; else it returns nil.
func (b *Backend) startWire(h *hold) *armWire {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watchedLocked(h) || b.reading[h.path] != nil || b.closed {
		return nil
	}
	r := &armWire{}
	b.reading[h.path] = r
	return r
}

// readWire reads h's node. With r from startWire, it records the watch
// when the node exists in h's session and no event for it arrived
// meanwhile.
func (b *Backend) readWire(ctx context.Context, h *hold, r *armWire) (statResult, error) {
	res, err := await(ctx, func() (statResult, error) {
		ok, st, err := b.conn.Exists(h.path)
		return statResult{exists: ok, stat: st}, err
	})
	if r == nil {
		return res, err
	}
	b.mu.Lock()
	if b.reading[h.path] == r {
		delete(b.reading, h.path)
	}
	if err == nil && res.exists && res.stat.EphemeralOwner == h.session && r.flipped && !r.fired &&
		b.holds[h.key] == h && !h.releasing {
		h.watchGen = r.gen
	}
	b.mu.Unlock()
	return res, err
}

// flipExists sets the watch flag of body, a request frame without its
// length, when it is an Exists of a node readWire is reading.
func (b *Backend) flipExists(body []byte) {
	// xid, opcode, path (int32 length, bytes), watch (one byte)
	if len(body) < 13 || int32(be32(body[4:8])) != opExists {
		return
	}
	n := int(be32(body[8:12]))
	if n < 0 || 12+n+1 != len(body) {
		return
	}
	b.mu.Lock()
	if r := b.reading[string(body[12:12+n])]; r != nil {
		body[12+n] = 1
		if !r.flipped {
			r.flipped, r.gen = true, b.gen.Load()
		}
	}
	b.mu.Unlock()
}

// wireEvent handles a watch event read off the wire: any event ends the
// watch of the node at path; its deletion loses the hold.
func (b *Backend) wireEvent(typ zk.EventType, path []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.reading[string(path)]; r != nil {
		r.fired = true
	}
	h := b.byPath[string(path)]
	if h == nil {
		return
	}
	h.watchGen = 0
	if typ != zk.EventNodeDeleted || h.releasing || b.closed {
		return // someone wrote to the node: no loss; the next Refresh watches it again
	}
	b.dispatchLocked([]loss{{b.takeLocked(h), fmt.Errorf("zklock: lock node %s was deleted: %w", h.path, dlock.ErrNotHeld)}})
}

// wireConnected handles the ConnectResponse of a new connection (b.gen
// counted it when it was dialled): session 0 (or no timeout) says the old
// session expired. Holds of any other session than the one now open are
// lost; the others are watched again.
func (b *Backend) wireConnected(session int64, timeout int32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	open := session != 0 && timeout > 0
	var ls []loss
	var again []*hold
	for _, h := range b.holds {
		if !open || h.session != session {
			ls = append(ls, loss{b.takeLocked(h), fmt.Errorf("zklock: lock node %s is gone: %w: %w", h.path, dlock.ErrNotHeld, zk.ErrSessionExpired)})
		} else {
			again = append(again, h)
		}
	}
	b.dispatchLocked(ls)
	b.rearmLocked(again)
}

// drainEvents reads the connection's event channel (on which go-zookeeper
// drops what nobody reads) until go-zookeeper closes it, once the
// connection is closed for good (by the Backend's Close or by its user):
// the session has ended, and with it the holds left.
func (b *Backend) drainEvents(events <-chan zk.Event) {
	for range events {
	}
	b.wireClosed()
}

// wireClosed loses every hold: the connection is closed for good.
func (b *Backend) wireClosed() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	var ls []loss
	for _, h := range b.holds {
		ls = append(ls, loss{b.takeLocked(h), fmt.Errorf("zklock: lock node %s is gone, connection closed (%w): %w", h.path, zk.ErrClosing, dlock.ErrNotHeld)})
	}
	b.dispatchLocked(ls)
}

// loss is the callbacks of a lost hold and the cause to call them with.
type loss struct {
	regs  []reg
	cause error
}

// dispatchLocked calls the callbacks of ls on a goroutine of its own.
// b.mu must be held, and b not closed.
func (b *Backend) dispatchLocked(ls []loss) {
	if len(ls) == 0 {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for _, l := range ls {
			for _, r := range l.regs {
				r.fn(l.cause)
			}
		}
	}()
}
