package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// Wait implements dlock.Waiter. etcd's only waiting mode is its queue, so
// r.FIFO is ignored: waiters are always served in the order their entries
// were created (by create revision).
//
// Wait creates the owner's entry with the Backend's lease and, in the same
// transaction, reads the entry created just before it. Until the entry
// heads the queue it watches only that predecessor for deletion (no herd:
// a release wakes exactly one waiter), then reads again, since the deleted
// predecessor may have been a waiter that gave up. While waiting it renews
// its lease every third of the TTL itself (the Client renews only granted
// locks). If the entry disappears meanwhile (its lease expired during a
// server outage), Wait queues again at the end.
//
// When ctx ends, Wait removes its entry with a fresh context and returns
// ctx.Err(). If the server does not confirm the removal within 1 s, Wait
// returns anyway and the Backend keeps trying in the background (the
// entry also expires with its lease, which nobody renews for it). Other
// errors are returned after the same cleanup. A reentrant owner that already holds the lock re-enters at
// once; one that is already queued joins its entry.
func (b *Backend) Wait(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	start := time.Now()
	sec, err := b.check(r)
	if err != nil {
		return dlock.Grant{}, err
	}
	w := &waiter{b: b, r: r, dir: b.dir(r.Key), name: b.entryName(r.Key, r.Token), sec: sec, start: start}
	g, err := w.run(ctx)
	if err != nil {
		switch {
		case w.claimed:
			b.abandon(ctx, r.Key, w.name, w.rev, r.Reentrant)
		case w.unknown != nil:
			b.dropCreated(ctx, w.name, w.unknown.id, r.Token)
		}
		if ctx.Err() != nil {
			return dlock.Grant{}, ctx.Err()
		}
		return dlock.Grant{}, err
	}
	return g, nil
}

// waiter is one Wait call.
type waiter struct {
	b     *Backend
	r     dlock.Request
	dir   string
	name  string
	sec   int64
	start time.Time

	claimed bool        // the entry holds a claim of ours (created or joined)
	unknown *leaseState // the last create had an unknown outcome, with this lease
	rev     int64       // the entry's create revision
	ls      *leaseState // the entry's lease
}

// position is what one read of the queue tells a waiter.
type position struct {
	pred    *mvccpb.KeyValue // the entry just before ours; nil: ours heads the queue
	head    bool             // pred heads the queue: once it is deleted, ours does
	count   int              // our entry's hold count
	mod     int64            // our entry's mod revision
	readRev int64            // the revision of the read
	recheck bool             // position unknown: read again
}

func (w *waiter) run(ctx context.Context) (dlock.Grant, error) {
	b := w.b
	leaseRetries := 0
	var seen int64 // a revision the next read must reflect (0: any)
	for {
		var (
			p   position
			err error
		)
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
		if p.recheck || !w.claimed {
			continue
		}
		if p.pred == nil {
			g, err := w.grant(ctx, p)
			if err == nil {
				return g, nil
			}
			if b.dead(w.ls) {
				continue // the entry went with its lease: the next check re-queues
			}
			return dlock.Grant{}, err
		}
		seen, err = w.awaitDelete(ctx, p.pred, p.readRev)
		if err != nil {
			return dlock.Grant{}, err
		}
		deleted := seen != 0
		if deleted && p.head && !w.r.Reentrant {
			// The holder's entry was deleted and nothing else was ahead of
			// ours (entries are only ever added behind): ours heads the
			// queue without another read. It still exists if its lease does,
			// which ensureFresh makes sure of.
			if g, err := w.grant(ctx, p); err == nil {
				return g, nil
			}
		}
	}
}

// grant turns the head position p into a grant, after making sure the
// entry's lease is valid now and until the call's start + TTL. It fails
// when the lease could not be renewed (if the lease is gone, the entry
// went with it and the caller reads again).
func (w *waiter) grant(ctx context.Context, p position) (dlock.Grant, error) {
	b := w.b
	if err := b.ensureFresh(ctx, w.ls, w.start, w.r.TTL); err != nil {
		return dlock.Grant{}, err
	}
	b.addHold(w.name, w.r.Key, w.r.Token, w.rev, w.ls, p.count, p.mod, p.readRev+1)
	w.claimed = false // a hold now, no longer ours to clean up
	return dlock.Grant{OK: true, Fence: uint64(w.rev), Count: p.count}, nil
}

var errRetryLease = errors.New("etcdlock: lease expired or was revoked while queuing")

// enqueue creates the owner's entry (or joins it, for a reentrant owner)
// and returns its position.
func (w *waiter) enqueue(ctx context.Context) (position, error) {
	b := w.b
	ls, err := b.lease(ctx, w.sec)
	if err != nil {
		return position{}, err
	}
	wait := b.startFresh(ctx, ls, w.start, w.r.TTL)
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(w.name), "=", 0)).
		Then(clientv3.OpPut(w.name, encodeValue(1, w.r.Token), clientv3.WithLease(ls.id)),
			clientv3.OpGet(w.dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
				clientv3.WithLimit(2), clientv3.WithKeysOnly())).
		Else(clientv3.OpGet(w.name), clientv3.OpGet(w.dir, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)).
		Commit()
	kaErr := wait()
	if isLeaseNotFound(err) {
		b.leaseGone(ls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(ls.id), dlock.ErrNotHeld))
		return position{}, errRetryLease
	}
	if err != nil {
		w.unknown = ls // the reply was lost: the entry may exist
		return position{}, fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, err)
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
		// Sorted newest first: ours, then our predecessor if any; More
		// tells whether anything is ahead of the predecessor.
		if rr := resp.Responses[1].GetResponseRange(); len(rr.Kvs) == 2 {
			p.pred, p.head = rr.Kvs[1], !rr.More
		}
		return p, nil
	}
	own := resp.Responses[0].GetResponseRange().Kvs
	if len(own) == 0 {
		return position{recheck: true}, nil // deleted in between
	}
	count, token, ok := decodeValue(own[0].Value)
	if !ok || token != w.r.Token {
		return position{}, errWrongType(w.name)
	}
	if !w.r.Reentrant {
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
	read := func(opts ...clientv3.OpOption) (*clientv3.TxnResponse, error) {
		return w.b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(w.name), "=", w.rev)).
			Then(clientv3.OpGet(w.name, opts...),
				clientv3.OpGet(w.dir, append(opts, clientv3.WithPrefix(), clientv3.WithMaxCreateRev(w.rev-1),
					clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())...)).
			Commit()
	}
	var (
		resp *clientv3.TxnResponse
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
		return position{}, fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, err)
	}
	if !resp.Succeeded {
		w.claimed = false
		return position{recheck: true}, nil
	}
	own := resp.Responses[0].GetResponseRange().Kvs[0]
	count, token, ok := decodeValue(own.Value)
	if !ok || token != w.r.Token {
		return position{}, errWrongType(w.name)
	}
	p := position{count: count, mod: own.ModRevision, readRev: resp.Header.Revision}
	if rr := resp.Responses[1].GetResponseRange(); len(rr.Kvs) > 0 {
		p.pred, p.head = rr.Kvs[0], !rr.More
	}
	return p, nil
}

// awaitDelete returns when pred (seen at revision readRev) is deleted,
// with a revision at which it was seen deleted, or with 0 when the
// position must be read again for another reason (the watch ended, the
// lease expired); with an error when ctx ends or the Backend closes.
//
// The watch starts at the server's current revision, never at an old one:
// etcd serves a watch that starts in the past from its history only every
// 100 ms, which would delay every hand-off (the cap measured for
// concurrency.Mutex). The revision in the watch's creation response tells
// whether anything was written since readRev; only then is pred read once
// more, so a deletion between the read and the watch is not missed.
func (w *waiter) awaitDelete(ctx context.Context, pred *mvccpb.KeyValue, readRev int64) (deletedAt int64, err error) {
	b := w.b
	// The watch context is the Backend's (its metadata picks the shared
	// watch stream), also cancelled when ctx ends: Watch itself waits for
	// the server to acknowledge the watch.
	wctx, cancel := context.WithCancel(b.waitCtx)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	key := string(pred.Key)
	wch := b.cli.Watch(wctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	timer := time.NewTimer(max(time.Until(b.renewAt(w.ls)), 0))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-b.ctx.Done():
			return 0, errClosed
		case resp, ok := <-wch:
			if !ok || resp.Canceled || resp.Err() != nil {
				if err := ctx.Err(); err != nil {
					return 0, err
				}
				return 0, nil // read again and watch again
			}
			if resp.Created {
				if resp.Header.Revision > readRev {
					g, err := b.cli.Get(ctx, key, clientv3.WithKeysOnly())
					if err != nil {
						return 0, fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, err)
					}
					if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != pred.CreateRevision {
						return g.Header.Revision, nil
					}
				}
				continue
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					return ev.Kv.ModRevision, nil
				}
			}
		case <-timer.C:
			err := b.keepAlive(ctx, w.ls)
			switch {
			case b.dead(w.ls):
				return 0, nil // the entry went with the lease: read again, queue again
			case ctx.Err() != nil:
				return 0, ctx.Err()
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
