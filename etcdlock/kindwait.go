package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// waitKind is Wait for a permit or read hold: it queues the entry and
// returns the grant once its kind's rule lets it in (see the package
// documentation, Permits and read holds). When ctx ends it removes the
// entry with a fresh context and returns ctx.Err().
func (b *Backend) waitKind(ctx context.Context, r dlock.Request, sec int64, start time.Time) (dlock.Grant, error) {
	if err := checkKind(r); err != nil {
		return dlock.Grant{}, err
	}
	b.clearOrphans(ctx, b.dir(r.Key))
	w := &kindWaiter{b: b, r: r, name: b.claimKindName(r), sec: sec, start: start}
	g, err := w.run(ctx)
	if err != nil {
		return dlock.Grant{}, b.waitFailed(ctx, r, w.name, &w.queued, err)
	}
	return g, nil
}

// kindWaiter is one waitKind call.
type kindWaiter struct {
	b     *Backend
	r     dlock.Request
	name  string
	sec   int64
	start time.Time
	queued
}

// errRecheck asks run to read the entry's position again.
var errRecheck = errors.New("etcdlock: read the queue again")

// maxRequeue bounds how often a kindWaiter queues again after its entry
// went with its lease, and takes another name after finding its own
// taken by a leftover.
const maxRequeue = 3

func (w *kindWaiter) run(ctx context.Context) (dlock.Grant, error) {
	requeued := 0
	for {
		var (
			blockers []*mvccpb.KeyValue
			readRev  int64
			err      error
		)
		if !w.claimed {
			if requeued++; requeued > maxRequeue+1 {
				return dlock.Grant{}, fmt.Errorf("etcdlock: acquire %q: queued %d times, the entry went every time: %w", w.r.Key, maxRequeue, dlock.ErrNotHeld)
			}
			blockers, readRev, err = w.enqueue(ctx)
		} else {
			blockers, readRev, err = w.check(ctx)
		}
		switch {
		case errors.Is(err, errRecheck):
			continue
		case err != nil:
			return dlock.Grant{}, err
		case !w.claimed:
			continue // the entry went with its lease: queue again
		case len(blockers) == 0:
			g, err := w.grant(ctx, readRev)
			if err == nil {
				return g, nil
			}
			if w.b.dead(w.ls) || errors.Is(err, dlock.ErrNotHeld) {
				continue // the entry went with its lease: the next check tells
			}
			return dlock.Grant{}, err
		}
		if err := w.await(ctx, blockers, readRev); err != nil {
			return dlock.Grant{}, err
		}
	}
}

// blockers returns the entries that keep ours out, from kvs, the read of
// the entries ahead of it made by kindTxn or check: for a reader the
// newest lock entry ahead (kvs has at most it); for a permit the Permits
// entries just ahead (kvs has ours first, then those ahead, newest
// first), none if fewer are ahead.
func (w *kindWaiter) blockers(kvs []*mvccpb.KeyValue) []*mvccpb.KeyValue {
	if w.r.Kind == dlock.KindRead {
		return kvs
	}
	if ahead := kvs[min(1, len(kvs)):]; len(ahead) >= w.r.Permits {
		return ahead
	}
	return nil
}

// enqueue creates the entry and returns what keeps it out (nothing: it
// is granted), read in the same transaction.
func (w *kindWaiter) enqueue(ctx context.Context) ([]*mvccpb.KeyValue, int64, error) {
	b := w.b
	ls, err := b.lease(ctx, w.sec)
	if err != nil {
		return nil, 0, err
	}
	wait := func() error { return nil }
	if _, ok := b.renewedAt(ls, w.r.TTL); !ok {
		wait = b.startFresh(ctx, ls, w.start, w.r.TTL)
	}
	resp, err := b.kindTxn(ctx, w.r, w.name, ls.id, false)
	kaErr := wait()
	if isLeaseNotFound(err) {
		b.leaseGone(ls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(ls.id), dlock.ErrNotHeld))
		return nil, 0, errRecheck // not created: queue again
	}
	if err != nil {
		w.unknown = ls // the reply was lost: the entry may exist
		return nil, 0, fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, rpcErr(ctx, err))
	}
	w.unknown = nil
	if !resp.Succeeded {
		leftover, err := b.kindRefusal(w.r, resp)
		if leftover != nil {
			b.retireSlot(w.r, w.name, leftover.CreateRevision)
			w.name = b.claimKindName(w.r)
			return nil, 0, errRecheck
		}
		if err == nil {
			err = errRecheck // what kept it out went meanwhile
		}
		return nil, 0, err
	}
	w.claimed, w.rev, w.ls = true, resp.Header.Revision, ls
	if kaErr != nil {
		if b.dead(ls) {
			return nil, 0, errRecheck // the entry went with its lease
		}
		return nil, 0, kaErr
	}
	return w.blockers(resp.Responses[1].GetResponseRange().Kvs), resp.Header.Revision, nil
}

// check reads the entries ahead of ours that may keep it out, and ours
// (if it is gone, with its lease, w.claimed turns false). One request.
func (w *kindWaiter) check(ctx context.Context) ([]*mvccpb.KeyValue, int64, error) {
	b := w.b
	dir := b.dir(w.r.Key)
	var (
		own, ahead []*mvccpb.KeyValue
		rev        int64
	)
	if w.r.Kind == dlock.KindRead {
		resp, err := b.cli.Txn(ctx).Then(
			clientv3.OpGet(w.name, clientv3.WithKeysOnly()),
			clientv3.OpGet(dir, clientv3.WithRange(dir+"~"), clientv3.WithMaxCreateRev(w.rev),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())).
			Commit()
		if err != nil {
			return nil, 0, fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, rpcErr(ctx, err))
		}
		own, ahead, rev = resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision
	} else {
		resp, err := b.cli.Get(ctx, dir+kindSub(w.r), clientv3.WithPrefix(), clientv3.WithMaxCreateRev(w.rev),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(int64(w.r.Permits)+1), clientv3.WithKeysOnly())
		if err != nil {
			return nil, 0, fmt.Errorf("etcdlock: acquire %q: %w", w.r.Key, rpcErr(ctx, err))
		}
		own, ahead, rev = resp.Kvs[:min(1, len(resp.Kvs))], resp.Kvs, resp.Header.Revision
	}
	if len(own) == 0 || string(own[0].Key) != w.name || own[0].CreateRevision != w.rev {
		w.claimed = false
		return nil, 0, nil
	}
	return w.blockers(ahead), rev, nil
}

// grant turns the entry into a hold, after making sure its lease is
// valid now and for TTL from the grant's Since, as the lock waiter's
// grant does.
func (w *kindWaiter) grant(ctx context.Context, readRev int64) (dlock.Grant, error) {
	b := w.b
	since, ok := b.renewedAt(w.ls, w.r.TTL)
	if !ok {
		if err := b.ensureFresh(ctx, w.ls, w.start, w.r.TTL); err != nil {
			return dlock.Grant{}, err
		}
		since, _ = b.renewedAt(w.ls, w.r.TTL)
	}
	b.addHold(w.name, w.r.Key, w.r.Token, w.rev, w.ls, 1, w.rev, readRev+1)
	w.claimed = false // a hold now, no longer ours to clean up
	return dlock.Grant{OK: true, Fence: uint64(w.rev), Count: 1, Since: since}, nil
}

// await waits until one of the blockers (seen at readRev) is deleted, or
// a watch ends, or the entry's lease is gone: the caller then reads
// again. Meanwhile it renews the entry's lease every TTL/3. The watches
// are the Backend's entry watches (entrywatch.go), as a lock waiter's.
func (w *kindWaiter) await(ctx context.Context, blockers []*mvccpb.KeyValue, readRev int64) error {
	b := w.b
	b.anchor()
	uses := make([]*entryUse, len(blockers))
	for i, kv := range blockers {
		uses[i] = b.watchEntry(kv, readRev, true)
	}
	defer func() {
		for _, u := range uses {
			u.release(b)
		}
	}()
	timer := time.NewTimer(max(time.Until(b.renewAt(w.ls)), 0))
	defer timer.Stop()
	lw := &waiter{b: b, r: w.r} // for entryUse.state's errors
	const fixed = 3
	cases := make([]reflect.SelectCase, 0, fixed+2*len(uses))
	owner := make([]*entryUse, 0, 2*len(uses))
	for {
		if b.ctx.Err() != nil {
			return errClosed
		}
		cases = append(cases[:0],
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(b.ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)})
		owner = owner[:0]
		for _, u := range uses {
			rev, changed, ch, err := u.state(ctx, lw)
			if err != nil {
				return err
			}
			if rev != 0 {
				return nil // deleted (or the watch ended): read again
			}
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(changed)})
			owner = append(owner, nil)
			if ch != nil {
				cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
				owner = append(owner, u)
			}
		}
		i, v, ok := reflect.Select(cases)
		switch i {
		case 0:
			return ctx.Err()
		case 1:
			return errClosed
		case 2:
			err := b.keepAlive(ctx, w.ls)
			switch {
			case b.dead(w.ls):
				return nil // the entry went with the lease: read again, queue again
			case ctx.Err() != nil:
				return ctx.Err()
			case err != nil:
				timer.Reset(b.retryDelay(w.ls))
			default:
				timer.Reset(max(time.Until(b.renewAt(w.ls)), 0))
			}
			continue
		}
		if u := owner[i-fixed]; u != nil {
			resp, _ := v.Interface().(clientv3.WatchResponse)
			b.consume(u.w, resp, ok)
		}
	}
}
