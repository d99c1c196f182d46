package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// abandonTimeout bounds the deletion of an acquisition's own node when it
// gives up (context ended, TryAcquire not first, an error). If the server
// does not answer in time the node is deleted in the background.
const abandonTimeout = time.Second

// watchAhead is a protocol switch, on; the hand-off benchmark turns it off
// in some of its runs to measure what it saves (export_test.go): a waiter
// third or further in line also watches the node before its predecessor
// (see queue).
var watchAhead atomic.Bool

func init() { watchAhead.Store(true) }

// maxCreates bounds the create attempts of one acquisition (a lost reply
// whose node is not found, an expired session, a parent deleted under it).
const maxCreates = 3

// TryAcquire implements dlock.Backend: it queues a lock node and, unless
// it is first in the queue, deletes it again and returns Grant{OK: false}
// (HolderTTL 0: a holder's lifetime is its session's). With r.Reentrant
// and r.Token holding the lock through this Backend, the hold count grows
// instead. A TTL above the session timeout is an error matching
// dlock.ErrInvalidTTL.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	return b.acquire(ctx, r, false)
}

// Wait implements dlock.Waiter: it queues a lock node and waits, watching
// the node just ahead of it (and, third or further in line, the one ahead
// of that), until the node is first (granted) or ctx ends. ZooKeeper's queue is its only waiting mode, so r.FIFO is
// ignored: waiters are always served in arrival order. When ctx ends, Wait
// deletes its node at once (with a fresh context bounded by one second,
// then in the background) and returns ctx's error. A short disconnection
// does not end the wait: the node lives as long as the session, and Wait
// resumes once reconnected; after a whole session timeout without an
// answer it gives up with the last error.
func (b *Backend) Wait(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	return b.acquire(ctx, r, true)
}

func (b *Backend) acquire(ctx context.Context, r dlock.Request, wait bool) (dlock.Grant, error) {
	if err := b.usable(); err != nil {
		return dlock.Grant{}, err
	}
	if err := dlock.ValidateKey(r.Key); err != nil {
		return dlock.Grant{}, fmt.Errorf("zklock: %w", err)
	}
	if err := b.checkTTL(ctx, r.TTL); err != nil {
		return dlock.Grant{}, err
	}
	if r.Reentrant {
		if g, ok, err := b.reenter(ctx, r); ok || err != nil {
			return g, err
		}
	}
	keyPath := b.KeyPath(r.Key)
	node, err := b.create(ctx, keyPath, newGUID(), []byte(r.Token))
	if err != nil {
		return dlock.Grant{}, zkErr("acquire", r.Key, err)
	}
	g, err := b.queue(ctx, r, keyPath, node, wait)
	return g, zkErr("acquire", r.Key, err)
}

// reenter grows the hold count when r.Token holds r.Key through this
// Backend and the server still has the node in this session. ok reports
// that the request was handled (err says how); ok false with a nil error
// means "not held here: queue a new node".
func (b *Backend) reenter(ctx context.Context, r dlock.Request) (g dlock.Grant, ok bool, err error) {
	k := holdKey{r.Key, r.Token}
	b.mu.Lock()
	h := b.holds[k]
	b.mu.Unlock()
	if h == nil {
		return dlock.Grant{}, false, nil
	}
	exists, st, err := b.exists(ctx, h.path)
	if err != nil {
		return dlock.Grant{}, true, zkErr("acquire", r.Key, err)
	}
	if !exists || st.EphemeralOwner != h.session {
		b.loseHold(h, h.goneErr())
		return dlock.Grant{}, false, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holds[k] != h {
		return dlock.Grant{}, false, nil // released or lost meanwhile
	}
	h.count++
	return dlock.Grant{OK: true, Fence: h.fence, Count: h.count}, true, nil
}

type statResult struct {
	exists bool
	stat   *zk.Stat
	watch  <-chan zk.Event
}

// queue takes node through the queue of keyPath: granted when it is
// first, else (wait) watching its predecessor until it is, or (!wait)
// deleting it. Every failure deletes the node.
func (b *Backend) queue(ctx context.Context, r dlock.Request, keyPath string, node created, wait bool) (dlock.Grant, error) {
	path, name := node.path, baseName(node.path)
	session := b.conn.SessionID() // the node's owner, unless it is read below
	// own is our node's Stat and an existence watch on it, read only when
	// needed: when the create did not tell the czxid (a recovered lost
	// reply), or when we wait second in line or further back (watching
	// ahead), where the watch makes the predecessor's deletion a grant
	// without listing again (see below).
	var own *statResult
	lastOK := time.Now()
	delay := 20 * time.Millisecond
	// retry decides what a failed request means: the wait goes on after a
	// transient failure (the session, and our node, may well be alive)
	// until a whole session timeout has passed without an answer.
	retry := func(err error) (bool, error) {
		if ctx.Err() != nil {
			b.abandon(path)
			return false, ctx.Err()
		}
		if wait && transient(err) && time.Since(lastOK) < b.SessionTimeout() && sleepCtx(ctx, delay) {
			delay = backoff(delay)
			return true, nil
		}
		b.abandon(path)
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, err
	}
	vanished := func() error {
		// Deleted while queued: the session expired, or someone deleted
		// it. Nothing to clean up.
		return fmt.Errorf("lock node %s vanished while queued (session expired?): %w", path, zk.ErrNoNode)
	}
	list := func() ([]string, error) {
		return await(ctx, func() ([]string, error) {
			c, _, err := b.conn.Children(keyPath)
			return c, err
		})
	}
	var (
		children []string
		listed   bool // children is a listing made since the last wake-up
	)
	for {
		if !listed {
			var err error
			if children, err = list(); err != nil {
				if again, err := retry(err); !again {
					return dlock.Grant{}, err
				}
				continue
			}
		}
		listed = false
		lastOK, delay = time.Now(), 20*time.Millisecond
		i, pred, pp := position(children, name)
		switch {
		case i < 0:
			return dlock.Grant{}, vanished()
		case i > 0 && !wait:
			b.abandon(path)
			return dlock.Grant{}, nil
		}
		// Our Stat: needed for the grant when the create did not tell the
		// czxid; and with a waiter, the watch on our node lets the
		// predecessor's deletion be the grant (see below). useOwn takes
		// the answer of an ExistsW on our node: it reports ok, or that the
		// loop must start again (err nil) or end with err.
		useOwn := func(res statResult, err error) (ok bool, _ error) {
			switch {
			case err != nil:
				_, err := retry(err)
				return false, err
			case !res.exists:
				return false, vanished()
			}
			own = &res
			node.czxid, session = res.stat.Czxid, res.stat.EphemeralOwner
			return true, nil
		}
		readOwn := func() (ok bool, err error) {
			return useOwn(b.watchOwn(ctx, path))
		}
		if i == 0 {
			if own == nil && node.czxid == 0 {
				if ok, err := readOwn(); !ok {
					if err != nil {
						return dlock.Grant{}, err
					}
					continue
				}
			}
			return b.granted(r, path, node.czxid, session, own)
		}
		// Watch the predecessor; third or further in line, the node before
		// it too (see below: its absence only costs the shortcut); and our
		// own node when the grant will need it. The requests are pipelined
		// on the connection (in flight together: one round trip, and the
		// server takes them in one go), and the server answers them in
		// the order sent.
		var (
			ppc  chan (<-chan zk.Event)
			ownc chan result[statResult]
		)
		if pp != "" && watchAhead.Load() {
			ppc = make(chan (<-chan zk.Event), 1)
			go func() { ppc <- b.watchBefore(ctx, keyPath+"/"+pp) }()
		}
		if own == nil && (node.czxid == 0 || i == 1 || ppc != nil) {
			ownc = make(chan result[statResult], 1)
			go func() {
				res, err := b.watchOwn(ctx, path)
				ownc <- result[statResult]{res, err}
			}()
		}
		watch, err := b.watchNode(ctx, keyPath+"/"+pred)
		var ppWatch <-chan zk.Event
		if ppc != nil {
			ppWatch = <-ppc
		}
		if ownc != nil {
			res := <-ownc
			if ok, err := useOwn(res.v, res.err); !ok {
				if err != nil {
					return dlock.Grant{}, err
				}
				continue
			}
		}
		switch {
		case errors.Is(err, zk.ErrNoNode) && i == 1 && own.armed():
			// The predecessor, the only node ahead of ours at the
			// listing, left before its watch could be set (a quick
			// release), and our node still exists (its watch is set and
			// has not fired): ours is the head. Granted without listing
			// again, as if the watch had fired.
			return b.granted(r, path, node.czxid, session, own)
		case errors.Is(err, zk.ErrNoNode):
			continue // the predecessor left already: look again
		case err != nil:
			if again, err := retry(err); !again {
				return dlock.Grant{}, err
			}
			continue
		}
	wait:
		for {
			select {
			case ev := <-watch:
				if ev.Type == zk.EventNodeDeleted && i == 2 && deleted(ppWatch) {
					// Both nodes ahead at the listing left (their events
					// came together): as if the one before the predecessor
					// had gone first (below).
					i = 1
				}
				if ev.Type == zk.EventNodeDeleted && i == 1 && own.armed() {
					// The predecessor was the head of the queue, and nodes
					// ahead of ours only ever leave (later nodes get higher
					// sequence numbers): ours is the head now, unless it was
					// deleted itself — and that event, being earlier, would
					// already be on own.watch (armed checks). Granted without
					// listing again: the hand-off costs the release's round
					// trip and one notification.
					return b.granted(r, path, node.czxid, session, own)
				}
				// A waiter ahead left, the node changed, or the watch was
				// dropped (session expired, connection closed): look again.
				break wait
			case ev := <-ppWatch:
				// The node before the predecessor changed, usually deleted
				// by its holder's release: the predecessor may hold the lock
				// now. Listing now, while it does, rather than after its own
				// release, takes that round trip off the path of the next
				// hand-off: if the predecessor heads the queue, its deletion
				// is the grant (second in line, above). If a waiter ahead
				// gave up instead, the node now before the predecessor is
				// watched. Each deletion thus wakes at most two waiters.
				ppWatch = nil
				if ev.Type == zk.EventNodeDeleted && i == 2 && own.armed() {
					// It and the predecessor were the only nodes ahead at
					// the listing, and nodes ahead only ever leave: the
					// predecessor heads the queue, no listing needed.
					i = 1
					continue
				}
				c, err := list()
				if err != nil {
					break wait // handled by the listing at the top
				}
				lastOK, delay = time.Now(), 20*time.Millisecond
				j, p2, pp2 := position(c, name)
				if j <= 0 || p2 != pred {
					children, listed = c, true // the predecessor left too
					break wait
				}
				i = j
				if pp2 != "" && watchAhead.Load() {
					ppWatch = b.watchBefore(ctx, keyPath+"/"+pp2)
				}
				if i == 1 && own == nil {
					if ok, err := readOwn(); !ok {
						if err != nil {
							return dlock.Grant{}, err
						}
						break wait
					}
				}
			case ev := <-own.ch():
				if ev.Type == zk.EventNodeDeleted {
					return dlock.Grant{}, vanished()
				}
				own.watch = nil // no longer watched: no shortcut
			case <-ctx.Done():
				b.abandon(path)
				return dlock.Grant{}, ctx.Err()
			case <-b.ctx.Done():
				b.abandon(path)
				return dlock.Grant{}, errClosed
			}
		}
	}
}

// watchBefore watches the node at path, ahead of a waiter's predecessor,
// for the queue loop: a node already gone yields a deletion event at once;
// a failed request, no watch (nil: only the shortcut is lost).
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

// armed reports whether the watch is set and has not fired.
func (s *statResult) armed() bool {
	if s == nil || s.watch == nil {
		return false
	}
	select {
	case <-s.watch:
		// Fired: a deletion makes the caller list again and find the
		// node gone; anything else just ends the watch.
		s.watch = nil
		return false
	default:
		return true
	}
}

// granted records the hold of the node at path, first in its queue. A
// hold granted without a watch on its node gets one from the armer once
// it has been held for watchDelay.
func (b *Backend) granted(r dlock.Request, path string, czxid, session int64, own *statResult) (dlock.Grant, error) {
	h := &hold{
		key:     holdKey{r.Key, r.Token},
		path:    path,
		fence:   uint64(czxid),
		session: session,
		count:   1,
	}
	watch := own.ch()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.abandon(path)
		return dlock.Grant{}, errClosed
	}
	old := b.holds[h.key]
	b.holds[h.key] = h
	if b.wired() {
		// A waiter's watch on its node (go-zookeeper's) is not used: the
		// armer sets a wire watch (wirewatch.go).
		b.byPath[path] = h
		b.scheduleArmLocked(h)
	} else if watch != nil {
		h.watch = watch
		b.attachLocked(h)
	} else {
		b.scheduleArmLocked(h)
	}
	b.mu.Unlock()
	if old != nil {
		// An earlier hold of the same token: its node cannot be first
		// in the queue any more, so it is gone (we were not told yet).
		b.loseHold(old, old.goneErr())
	}
	return dlock.Grant{OK: true, Fence: h.fence, Count: 1}, nil
}

// abandon deletes an acquisition's own node at once, bounded by
// abandonTimeout; if that fails the node is deleted in the background.
func (b *Backend) abandon(path string) {
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	err := b.delete(ctx, path)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		b.reap(path, 0)
	}
}

// created is a lock node made by create: its path, and its czxid when
// the create reported it (0 otherwise).
type created struct {
	path  string
	czxid int64
}

// create makes the protected ephemeral sequential node
// keyPath/_c_<guid>-lock-<seq> holding data, creating missing parents.
// When the reply of a create is lost with the connection, the node may
// exist: it is looked up by its guid prefix (recoverCreate) before
// creating again, so a lost reply never leaves an orphan in the queue.
// When ctx ends while a create is in flight, its outcome is awaited in the
// background and a node it made is deleted.
func (b *Backend) create(ctx context.Context, keyPath, guid string, data []byte) (created, error) {
	prefix := keyPath + "/" + nodePrefix(guid)
	var lastErr error
	for attempt := 1; attempt <= maxCreates; attempt++ {
		node, pending, err := awaitWrite(ctx, func() (created, error) {
			return b.createOnce(prefix, keyPath, data)
		})
		if pending != nil {
			b.reapCreate(pending, keyPath, guid)
			return created{}, err
		}
		switch {
		case err == nil:
			return node, nil
		case errors.Is(err, zk.ErrNoNode):
			// The key's node is missing (first use, or its container was
			// reaped by the server): create it and try again.
			if err := b.ensureParents(ctx, keyPath); err != nil {
				return created{}, err
			}
		case transient(err):
			found, ferr := b.recoverCreate(ctx, keyPath, guid)
			if ferr != nil {
				b.reapCreate(nil, keyPath, guid)
				return created{}, ferr
			}
			if found != "" {
				return created{path: found}, nil
			}
		case errors.Is(err, zk.ErrSessionExpired):
			// Nothing was created; the connection opens a new session.
		default:
			return created{}, fmt.Errorf("create lock node in %s: %w", keyPath, err)
		}
		lastErr = err
	}
	return created{}, fmt.Errorf("create lock node in %s: gave up after %d attempts: %w", keyPath, maxCreates, lastErr)
}

// createOnce sends one create and learns the new node's czxid (its fence)
// without reading the node when it can. With Connect, it is read off the
// wire from the create's reply (wire.go). With New, the create goes in a
// multi-op with an empty write to the queue node: both share the
// transaction's zxid, which the write's Stat returns as Mzxid; a queue
// node we may not write to (made by someone else, with a narrower ACL)
// makes the Backend fall back to plain creates. Otherwise the czxid is 0
// and the grant reads it.
func (b *Backend) createOnce(prefix, keyPath string, data []byte) (created, error) {
	if b.owned || b.plainCreate.Load() {
		path, err := b.conn.Create(prefix, data, zk.FlagEphemeralSequential, b.cfg.acl)
		if err != nil {
			b.czxids.take(prefix)
			return created{}, err
		}
		return created{path: path, czxid: b.czxids.take(prefix)}, nil
	}
	res, err := b.conn.Multi(
		&zk.CreateRequest{Path: prefix, Data: data, Acl: b.cfg.acl, Flags: zk.FlagEphemeralSequential},
		&zk.SetDataRequest{Path: keyPath, Data: nil, Version: -1},
	)
	if err == nil {
		var node created
		if len(res) == 2 {
			node.path = res[0].String
			if res[1].Stat != nil {
				node.czxid = res[1].Stat.Mzxid
			}
		}
		if node.path == "" {
			return node, fmt.Errorf("create lock node: unexpected multi reply %+v", res)
		}
		return node, nil
	}
	if !errors.Is(err, zk.ErrNoAuth) || len(res) != 2 || res[0].Error != nil {
		return created{}, err
	}
	b.plainCreate.Store(true)
	path, err := b.conn.Create(prefix, data, zk.FlagEphemeralSequential, b.cfg.acl)
	return created{path: path}, err
}

// recoverCreate finds the node of guid after a create whose reply was
// lost. It retries the listing while the connection is down, bounded by
// ctx and one session timeout (after which the session, and any node it
// made, has expired or the server is unreachable anyway). It returns the
// node's path, or "" when no node was made.
func (b *Backend) recoverCreate(ctx context.Context, keyPath, guid string) (string, error) {
	deadline := time.Now().Add(b.SessionTimeout())
	delay := 20 * time.Millisecond
	for {
		children, err := await(ctx, func() ([]string, error) {
			c, _, err := b.conn.Children(keyPath)
			return c, err
		})
		switch {
		case err == nil:
			if name := findProtected(children, guid); name != "" {
				return keyPath + "/" + name, nil
			}
			return "", nil
		case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrSessionExpired):
			return "", nil // no parent, or the session (and its nodes) is gone
		case ctx.Err() != nil:
			return "", ctx.Err()
		case !transient(err) || time.Now().After(deadline):
			return "", fmt.Errorf("find lock node after a lost create reply: %w", err)
		}
		if !sleepCtx(ctx, delay) {
			return "", ctx.Err()
		}
		delay = backoff(delay)
	}
}

// ensureParents creates the root path (persistent znodes, once per
// Backend) and the key's node (a container znode, which the server
// deletes some time after its last child is gone; servers without
// containers get a persistent znode). Parents are never deleted by
// zklock: a create racing with the server's container clean-up gets
// ErrNoNode and create comes back here.
func (b *Backend) ensureParents(ctx context.Context, keyPath string) error {
	b.mu.Lock()
	rootOK := b.rootOK
	b.mu.Unlock()
	if !rootOK {
		if err := b.mkdirs(ctx, b.cfg.path); err != nil {
			return err
		}
		b.mu.Lock()
		b.rootOK = true
		b.mu.Unlock()
	}
	_, err := await(ctx, func() (string, error) {
		return b.conn.CreateContainer(keyPath, nil, zk.FlagContainer, b.cfg.acl)
	})
	switch {
	case err == nil, errors.Is(err, zk.ErrNodeExists):
		return nil
	case errors.Is(err, zk.ErrNoNode):
		b.mu.Lock()
		b.rootOK = false // someone deleted the root: create it again next time
		b.mu.Unlock()
		return nil
	case transient(err), ctx.Err() != nil, errors.Is(err, zk.ErrNoAuth):
		return fmt.Errorf("create %s: %w", keyPath, err)
	}
	// Probably a server without container nodes (before 3.5.3).
	if _, perr := await(ctx, func() (string, error) {
		return b.conn.Create(keyPath, nil, zk.FlagPersistent, b.cfg.acl)
	}); perr != nil && !errors.Is(perr, zk.ErrNodeExists) {
		return fmt.Errorf("create %s: %w", keyPath, err)
	}
	return nil
}

// mkdirs creates the missing components of path as empty persistent
// znodes, checking each first (a create of an existing node can fail for
// lack of permission on its parent).
func (b *Backend) mkdirs(ctx context.Context, path string) error {
	for i := 1; i <= len(path); i++ {
		if i < len(path) && path[i] != '/' {
			continue
		}
		p := path[:i]
		ok, _, err := b.exists(ctx, p)
		if err != nil {
			return fmt.Errorf("check %s: %w", p, err)
		}
		if ok {
			continue
		}
		_, err = await(ctx, func() (string, error) { return b.conn.Create(p, nil, zk.FlagPersistent, b.cfg.acl) })
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	return nil
}

// exists is Conn.Exists bounded by ctx.
func (b *Backend) exists(ctx context.Context, path string) (bool, *zk.Stat, error) {
	r, err := await(ctx, func() (statResult, error) {
		ok, st, err := b.conn.Exists(path)
		return statResult{exists: ok, stat: st}, err
	})
	return r.exists, r.stat, err
}

// delete is Conn.Delete of any version bounded by ctx; only paths of our
// own lock nodes are passed (unique names: guid and sequence).
func (b *Backend) delete(ctx context.Context, path string) error {
	_, err := await(ctx, func() (struct{}, error) { return struct{}{}, b.conn.Delete(path, -1) })
	return err
}
