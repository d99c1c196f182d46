package zklock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// abandonTimeout bounds the deletion of an acquisition's own node when it
// gives up (context ended, TryAcquire not first, an error). If the server
// does not answer in time the node is deleted in the background.
const abandonTimeout = time.Second

// maxCreates bounds the create attempts of one acquisition (a lost reply
// whose node is not found, an expired session, a parent deleted under it).
const maxCreates = 3

// TryAcquire implements dlock.Backend: it queues a node of the request's
// kind and returns a grant when the node is first (a permit: among the
// first N; a read hold: behind no writer), else deletes it and returns
// Grant{OK: false}. A reentrant request of the token holding the lock
// through this Backend raises its hold count. A TTL outside [MinTTL,
// SessionTimeout] is an error matching dlock.ErrInvalidTTL; a kind that
// does not mix with the nodes ahead, dlock.ErrWrongType; a permit count
// that disagrees with theirs, dlock.ErrPermits.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	return b.acquire(ctx, r, false)
}

// Wait implements dlock.Waiter: it queues a node of the request's kind
// and waits, in arrival order (r.FIFO is implied), until it is granted as
// for TryAcquire or ctx ends.
// When ctx ends it deletes the node (in the background if the server does
// not answer within a second) and returns ctx's error. A disconnection
// shorter than the session timeout does not end the wait.
func (b *Backend) Wait(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	return b.acquire(ctx, r, true)
}

func (b *Backend) acquire(ctx context.Context, r dlock.Request, wait bool) (dlock.Grant, error) {
	if err := b.usableFor(r.Key); err != nil {
		return dlock.Grant{}, err
	}
	if err := b.checkTTL(ctx, r.TTL); err != nil {
		return dlock.Grant{}, err
	}
	if err := checkKind(r); err != nil {
		return dlock.Grant{}, err
	}
	if b.holdsOther(r) {
		// A token has one hold of a key here, and only a lock re-enters.
		return dlock.Grant{}, nil
	}
	if r.Reentrant && r.Kind == dlock.KindLock {
		if g, ok, err := b.reenter(ctx, r); ok || err != nil {
			return g, err
		}
	}
	keyPath := b.KeyPath(r.Key)
	guid := newGUID()
	value := r.Value
	if r.Kind != dlock.KindLock {
		value = ""
	}
	node, err := b.create(ctx, keyPath, guid, kindPrefix(guid, r.Kind, r.Permits), encodeData(r.Token, value))
	if err != nil {
		return dlock.Grant{}, zkErr("acquire", r.Key, err)
	}
	g, err := b.queue(ctx, r, keyPath, node, wait)
	return g, zkErr("acquire", r.Key, err)
}

// holdsOther reports whether r.Token holds r.Key through this Backend
// with a hold that r cannot join: a permit or read hold, or a lock when r
// is of another kind.
func (b *Backend) holdsOther(r dlock.Request) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.holds[holdKey{r.Key, r.Token}]
	return h != nil && (h.kind != dlock.KindLock || r.Kind != dlock.KindLock)
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
	if h.kind != dlock.KindLock {
		return dlock.Grant{}, true, nil // not a lock: nothing to re-enter
	}
	h.count++
	h.pending++
	h.orphanGen++
	return dlock.Grant{OK: true, Fence: h.fence, Count: h.count}, true, nil
}

// granted records the hold of the node at path, first in its queue. A
// hold granted without a watch on its node gets one from the armer once
// it has been held for watchDelay.
func (b *Backend) granted(r dlock.Request, path string, czxid, session int64, own *statResult) (dlock.Grant, error) {
	h := &hold{
		kind:    r.Kind,
		key:     holdKey{r.Key, r.Token},
		path:    path,
		fence:   uint64(czxid),
		session: session,
		count:   1,
		pending: 1,
	}
	watch := own.ch()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return dlock.Grant{}, errClosed // queue deletes the node
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

// settleCreate undoes a create whose ctx ended while it was in flight:
// it awaits the outcome for at most abandonTimeout and deletes the node
// made, or leaves the rest to reapCreate in the background.
func (b *Backend) settleCreate(pending <-chan result[created], keyPath, guid string) {
	t := time.NewTimer(abandonTimeout)
	defer t.Stop()
	select {
	case r := <-pending:
		switch {
		case r.err == nil:
			b.abandon(r.v.path)
		case transient(r.err):
			b.reapCreate(nil, keyPath, guid) // made or not: found by its guid
		}
	case <-t.C:
		b.reapCreate(pending, keyPath, guid)
	}
}

// created is a lock node made by create: its path, and its czxid when
// the create reported it (0 otherwise).
type created struct {
	path  string
	czxid int64
}

// create makes the protected ephemeral sequential node keyPath/name<seq>
// holding data, creating missing parents; name is the node name prefix of
// guid (nodePrefix, or kindPrefix for the other kinds).
// When the reply of a create is lost with the connection, the node may
// exist: it is looked up by its guid prefix (recoverCreate) before
// creating again, so a lost reply never leaves an orphan in the queue.
// When ctx ends while a create is in flight, its outcome is awaited (at
// most abandonTimeout, then in the background) and a node it made is
// deleted before create returns, so that a cancelled acquisition leaves
// nothing in the queue.
func (b *Backend) create(ctx context.Context, keyPath, guid, name string, data []byte) (created, error) {
	prefix := keyPath + "/" + name
	var lastErr error
	for attempt := 1; attempt <= maxCreates; attempt++ {
		node, pending, err := awaitWrite(ctx, func() (created, error) {
			return b.createOnce(prefix, keyPath, data)
		})
		if pending != nil {
			b.settleCreate(pending, keyPath, guid)
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
		children, err := await(ctx, func() ([]string, error) { return b.syncedChildren(keyPath) })
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

// syncedChildren lists keyPath's children after a Sync of it: a server the
// session moved to after a lost create reply may lag behind the create
// (the client never saw its zxid), and a listing before the Sync would
// miss the node the create made.
func (b *Backend) syncedChildren(keyPath string) ([]string, error) {
	if _, err := b.conn.Sync(keyPath); err != nil {
		return nil, err
	}
	c, _, err := b.conn.Children(keyPath)
	return c, err
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
