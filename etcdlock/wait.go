package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// Wait implements dlock.Waiter: it queues the owner's entry and returns
// the grant once the entry heads the queue (r.FIFO is ignored: etcd
// always serves in creation order). When ctx ends it removes the entry
// with a fresh context and returns ctx.Err(). See the package
// documentation, Waiting; a permit or read request waits as its kind
// allows (see waitKind).
func (b *Backend) Wait(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	start := time.Now()
	sec, err := b.check(r)
	if err != nil {
		return dlock.Grant{}, err
	}
	if r.Kind != dlock.KindLock {
		return b.waitKind(ctx, r, sec, start)
	}
	dir := b.dir(r.Key)
	b.clearOrphans(ctx, dir)
	w := &waiter{b: b, r: r, dir: dir, name: b.claimName(r), sec: sec, start: start}
	g, err := w.run(ctx)
	if err != nil {
		return dlock.Grant{}, b.waitFailed(ctx, r, w.name, &w.queued, err)
	}
	return g, nil
}

// queued is what a wait knows of the entry it queued.
type queued struct {
	claimed bool        // the entry holds a claim of ours (created, or joined by a re-entry)
	unknown *leaseState // the last create had an unknown outcome, with this lease
	floor   int64       // ... and created nothing at or below this revision (0 for a kind)
	rev     int64       // the entry's create revision
	ls      *leaseState // the entry's lease
}

// waitFailed undoes what a wait for r on entry name left behind when it
// failed with err: the claim q holds on the entry, or the entry a create
// of unknown outcome may have made, and the claim of the name. It
// returns ctx.Err() when ctx ended, else err.
func (b *Backend) waitFailed(ctx context.Context, r dlock.Request, name string, q *queued, err error) error {
	switch {
	case q.claimed:
		b.abandon(ctx, r.Key, name, q.rev, r.Reentrant)
	case q.unknown != nil:
		b.dropCreated(ctx, name, q.unknown, entryValue(r), q.floor)
	}
	b.unclaim(r, name)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// waiter is one Wait call.
type waiter struct {
	b     *Backend
	r     dlock.Request
	dir   string
	name  string
	sec   int64
	start time.Time
	queued
}

// position is what one read of the queue tells a waiter.
type position struct {
	pred    *mvccpb.KeyValue // the entry just before ours; nil: ours heads the queue
	pp      *mvccpb.KeyValue // the entry just before pred, if any (read for non-reentrant waiters only)
	head    bool             // pred heads the queue: once it is deleted, ours does
	count   int              // our entry's hold count
	mod     int64            // our entry's mod revision
	readRev int64            // the revision of the read
	recheck bool             // position unknown: read again
}

func (w *waiter) run(ctx context.Context) (dlock.Grant, error) {
	b := w.b
	leaseRetries := 0
	var (
		seen int64 // a revision the next read must reflect (0: any)
		p    position
		have bool // p is current: no read needed
	)
	for {
		if !have {
			var err error
			if !w.claimed {
				p, err = w.enqueue(ctx)
			} else {
				p, err = w.check(ctx, seen)
			}
			if errors.Is(err, errRetryLease) {
				if leaseRetries++; leaseRetries > 3 {
					return dlock.Grant{}, err
				}
				continue
			}
			if err != nil {
				return dlock.Grant{}, err
			}
		}
		have = false
		if p.recheck || !w.claimed {
			continue
		}
		if p.pred == nil {
			g, err := w.grant(ctx, p)
			if err == nil {
				return g, nil
			}
			if b.dead(w.ls) || errors.Is(err, dlock.ErrNotHeld) {
				continue // the entry went (with its lease): the next check re-queues
			}
			return dlock.Grant{}, err
		}
		var (
			next *position
			err  error
		)
		seen, next, err = w.awaitDelete(ctx, &p)
		if err != nil {
			return dlock.Grant{}, err
		}
		if next != nil {
			p, have = *next, true
			continue
		}
		if seen != 0 && p.head && !w.r.Reentrant {
			// The predecessor was deleted and nothing else was ahead of it
			// when last read (entries are only ever added behind): ours
			// heads the queue without another read. It still exists if its
			// lease does, which grant makes sure of.
			if g, err := w.grant(ctx, p); err == nil {
				return g, nil
			}
		}
	}
}

// grant turns the head position p into a grant, after making sure the
// entry's lease is valid now and for TTL from the grant's Since (a renewal
// at most TTL/10 ago, see renewedAt) or else from the call's start (with a
// keep-alive if needed). It fails when the lease could not be renewed (if
// the lease is gone, the entry went with it and the caller reads again).
func (w *waiter) grant(ctx context.Context, p position) (dlock.Grant, error) {
	b := w.b
	if w.r.Reentrant && (w.ls.foreign || !b.longEnough(w.ls, w.r.TTL)) {
		// A joined entry: make it live long enough for this hold too.
		ls, err := b.fitEntry(ctx, w.r, w.name, w.rev, w.sec, w.start)
		if err != nil {
			return dlock.Grant{}, err
		}
		w.ls = ls
	}
	since, ok := b.renewedAt(w.ls, w.r.TTL)
	if !ok {
		if err := b.ensureFresh(ctx, w.ls, w.start, w.r.TTL); err != nil {
			return dlock.Grant{}, err
		}
		// A keep-alive ensureFresh just sent dates the grant; otherwise
		// the Client dates it from the start of the wait (and renews
		// once if that was long ago).
		since, _ = b.renewedAt(w.ls, w.r.TTL)
	}
	b.addHold(w.name, w.r.Key, w.r.Token, w.rev, w.ls, p.count, p.mod, p.readRev+1)
	w.claimed = false // a hold now, no longer ours to clean up
	return dlock.Grant{OK: true, Fence: uint64(w.rev), Count: p.count, Since: since}, nil
}

var errRetryLease = errors.New("etcdlock: lease expired or was revoked while queuing")

// enqueue creates the owner's entry (or joins it, for a reentrant owner)
// and returns its position.
func (w *waiter) enqueue(ctx context.Context) (position, error) {
	b := w.b
	ls, err := b.leaseOf(ctx, w.r, w.sec)
	if err != nil {
		return position{}, err
	}
	floor := b.heldFence(w.name)
	wait := func() error { return nil }
	if _, ok := b.renewedAt(ls, w.r.TTL); !ok {
		wait = b.startFresh(ctx, ls, w.start, w.r.TTL)
	}
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.name), "=", 0)).
		Then(clientv3.OpPut(w.name, entryValue(w.r), clientv3.WithLease(ls.id)),
			clientv3.OpGet(w.dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
				clientv3.WithLimit(w.queueRead()+1), clientv3.WithKeysOnly())).
		Else(clientv3.OpGet(w.name), clientv3.OpGet(w.dir, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)).
		Commit()
	kaErr := wait()
	if isLeaseNotFound(err) {
		b.leaseGone(ls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(ls.id), dlock.ErrNotHeld))
		return position{}, errRetryLease
	}
	if err != nil {
		w.unknown, w.floor = ls, floor // the reply was lost: the entry may exist
		return position{}, fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, rpcErr(ctx, err))
	}
	w.unknown = nil
	if resp.Succeeded {
		w.claimed, w.rev, w.ls = true, resp.Header.Revision, ls
		if kaErr != nil {
			if b.dead(ls) {
				return position{recheck: true}, nil
			}
			return position{}, kaErr
		}
		p := position{count: 1, mod: w.rev, readRev: w.rev}
		// Sorted newest first: ours, then the entries ahead of it.
		p.ahead(resp.Responses[1].GetResponseRange(), 1)
		return p, nil
	}
	b.putSpare(ls) // nothing was attached to it
	own := resp.Responses[0].GetResponseRange().Kvs
	if len(own) == 0 {
		return position{recheck: true}, nil // deleted in between
	}
	count, token, ok := decodeValue(own[0].Value)
	switch {
	case !w.r.Reentrant && (!ok || token != w.r.Token):
		// A leftover of an earlier use of our slot: take another one.
		b.retireSlot(w.r, w.name, own[0].CreateRevision)
		w.name = b.claimName(w.r)
		return position{recheck: true}, nil
	case !ok || token != w.r.Token:
		return position{}, errWrongType(w.name)
	case !w.r.Reentrant:
		return position{}, errTokenInUse(w.r.Key)
	}
	// Join the owner's entry: one more claim on it.
	n, mod, _, err := b.bump(ctx, w.name, w.r.Key, w.r.Token, own[0].CreateRevision, count, own[0].ModRevision, +1)
	if errors.Is(err, dlock.ErrNotHeld) {
		return position{recheck: true}, nil
	}
	if err != nil {
		return position{}, err
	}
	w.claimed, w.rev, w.ls = true, own[0].CreateRevision, b.leaseFor(clientv3.LeaseID(own[0].Lease))
	head := resp.Responses[1].GetResponseRange().Kvs
	if len(head) > 0 && string(head[0].Key) == w.name {
		return position{count: n, mod: mod, readRev: mod}, nil
	}
	return position{recheck: true}, nil
}

// check reads the entry's position again. If the entry is gone (its lease
// expired), the claim is dropped and the caller queues again.
//
// With seen > 0 (the revision of the predecessor's deletion) the read is
// first made serializable, served by the member without a round of
// consensus, and used only if it reflects revision seen or later. That
// is enough: entries ahead of ours can only disappear (new entries queue
// behind), so a view at or after seen shows at most the entries still
// ahead, and ours existed at seen. Otherwise (a lagging member) the read
// is repeated linearizably.
func (w *waiter) check(ctx context.Context, seen int64) (position, error) {
	if w.rev <= 1 {
		return position{}, fmt.Errorf("etcdlock: lock %q: impossible create revision %d", w.r.Key, w.rev)
	}
	// One Range (cheaper for the server than a Txn of two): our entry and
	// the entries ahead of it, newest first. Only our entry was created at
	// revision w.rev, so a first entry that is not ours at w.rev means ours
	// is gone.
	read := func(opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
		return w.b.cli.Get(ctx, w.dir, append(opts, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(w.rev),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(w.queueRead()+1))...)
	}
	var (
		resp *clientv3.GetResponse
		err  error
	)
	if seen > 0 {
		resp, err = read(clientv3.WithSerializable())
		if err == nil && resp.Header.Revision < seen {
			resp = nil
		}
	}
	if resp == nil {
		resp, err = read()
	}
	if err != nil {
		return position{}, fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, rpcErr(ctx, err))
	}
	if len(resp.Kvs) == 0 || string(resp.Kvs[0].Key) != w.name || resp.Kvs[0].CreateRevision != w.rev {
		w.claimed = false
		return position{recheck: true}, nil
	}
	own := resp.Kvs[0]
	count, token, ok := decodeValue(own.Value)
	if !ok || token != w.r.Token {
		return position{}, errWrongType(w.name)
	}
	p := position{count: count, mod: own.ModRevision, readRev: resp.Header.Revision}
	p.ahead((*etcdserverpb.RangeResponse)(resp), 1)
	return p, nil
}

// queueRead is how many entries ahead of its own a waiter reads: the
// predecessor, and for a non-reentrant waiter also the entry before it,
// whose deletion it watches too (see awaitDelete).
func (w *waiter) queueRead() int64 {
	if w.r.Reentrant || !w.b.tune.watchAhead {
		return 1
	}
	return 2
}

// ahead fills in the entries ahead of ours from rr, a read of the
// directory sorted by create revision, newest first, whose first skip
// entries are not ahead of ours.
func (p *position) ahead(rr *etcdserverpb.RangeResponse, skip int) {
	kvs := rr.Kvs[min(skip, len(rr.Kvs)):]
	if len(kvs) == 0 {
		return
	}
	p.pred = kvs[0]
	if len(kvs) > 1 {
		p.pp = kvs[1]
	} else {
		p.head = !rr.More
	}
}

// awaitDelete waits for the deletion of p.pred (seen at revision
// p.readRev) and returns a revision at which it was seen deleted. It
// returns next, a position read meanwhile, when that read found the
// predecessor gone or changed; neither (0, nil) when the position must be
// read again for another reason (the watch ended, the lease expired); an
// error when ctx ends or the Backend closes.
//
// When p.pp, the entry before the predecessor, is known, it is watched
// too: its deletion usually means the predecessor now holds the lock, and
// a read then (while the predecessor holds it, off the path of the next
// hand-off) tells whether it heads the queue; if so, p.head is set and the
// predecessor's deletion is the grant, without a read after it. A deleted
// p.pp may also have been a waiter that gave up: the read then shows the
// entry now before the predecessor, which is watched instead. Each
// deletion thus wakes at most two waiters, the next one and the one after.
//
// The watches are the Backend's entry watches (entrywatch.go): usually
// open already from an earlier wait, else started at the server's
// current revision, never at an old one: etcd serves a watch that starts
// in the past from its history only every 100 ms, which would delay every
// hand-off (the cap measured for concurrency.Mutex). A new watch of the
// predecessor that started after the read is checked with one more read
// (see entryUse.state), so a deletion in between is not missed.
func (w *waiter) awaitDelete(ctx context.Context, p *position) (deletedAt int64, next *position, err error) {
	b := w.b
	b.anchor()
	pred := b.watchEntry(p.pred, p.readRev, true)
	defer pred.release(b)
	var pp *entryUse
	if p.pp != nil && !w.r.Reentrant && b.tune.watchAhead {
		pp = b.watchEntry(p.pp, p.readRev, false)
	}
	defer func() { pp.release(b) }()
	timer := time.NewTimer(max(time.Until(b.renewAt(w.ls)), 0))
	defer timer.Stop()
	for {
		if b.ctx.Err() != nil {
			return 0, nil, errClosed
		}
		rev, predCh, predEv, err := pred.state(ctx, w)
		if err != nil || rev != 0 {
			return max(rev, 0), nil, err
		}
		var (
			ppCh <-chan struct{}
			ppEv clientv3.WatchChan
		)
		if pp != nil {
			rev, ppCh, ppEv, err = pp.state(ctx, w)
			switch {
			case err != nil:
				return 0, nil, err
			case rev < 0:
				pp.release(b) // no shortcut: the predecessor's deletion is read after
				pp = nil
				continue
			case rev > 0:
				pp.release(b)
				pp = nil
				q, err := w.check(ctx, rev)
				switch {
				case err != nil:
					return 0, nil, err
				case q.recheck || !w.claimed:
					return 0, nil, nil
				case q.pred == nil || string(q.pred.Key) != string(p.pred.Key) || q.pred.CreateRevision != p.pred.CreateRevision:
					return 0, &q, nil
				}
				*p = q
				if q.pp != nil {
					pp = b.watchEntry(q.pp, q.readRev, false)
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		case <-b.ctx.Done():
			return 0, nil, errClosed
		case <-predCh:
		case <-ppCh:
		case resp, ok := <-predEv:
			b.consume(pred.w, resp, ok)
		case resp, ok := <-ppEv:
			b.consume(pp.w, resp, ok)
		case <-timer.C:
			err := b.keepAlive(ctx, w.ls)
			switch {
			case b.dead(w.ls):
				return 0, nil, nil // the entry went with the lease: read again, queue again
			case ctx.Err() != nil:
				return 0, nil, ctx.Err()
			case err != nil:
				// Unreachable for now: try again soon; the entry lives until
				// the lease's TTL runs out.
				timer.Reset(b.retryDelay(w.ls))
			default:
				timer.Reset(max(time.Until(b.renewAt(w.ls)), 0))
			}
		}
	}
}

// errAcquire wraps a server error of the acquisition.
func (w *waiter) errAcquire(err error) error {
	return fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, err)
}

// anchor starts anchorLoop unless it runs.
func (b *Backend) anchor() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || !b.tune.anchorStream {
		return
	}
	b.startLocked(&b.waits.anchored, b.anchorLoop)
}

// anchorLoop keeps one watch open on the waiters' watch stream for the
// Backend's lifetime (from its first wait on): a watch that never reports
// anything (it filters out both puts and deletes, of a key dlock never
// writes). The etcd client closes a watch stream when its last watch ends
// and opens a new one (a new gRPC stream, with its goroutines on both
// sides) for the next watch; without the anchor, a Backend that waits for
// a lock, holds it and waits again would pay for a new stream with every
// wait (measured: with it, creating and cancelling a watch cost the server
// about 30% and the client about 80% more CPU).
func (b *Backend) anchorLoop() {
	defer b.wg.Done()
	for {
		ctx, cancel := context.WithCancel(b.waitCtx)
		for range b.cli.Watch(ctx, b.prefix, clientv3.WithFilterPut(), clientv3.WithFilterDelete()) {
		}
		cancel()
		if b.ctx.Err() != nil || b.cli.Ctx().Err() != nil {
			return
		}
		t := time.NewTimer(anchorRetry)
		select {
		case <-b.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
