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

var (
	_ dlock.Inspector     = (*Backend)(nil)
	_ dlock.ForceReleaser = (*Backend)(nil)
)

// Inspect implements dlock.Inspector: the holder of the lock key (the
// entry heading its queue) with its owner token, fence, hold count,
// value (an elected leader's) and remaining lease TTL, and the number of
// queued waiters; or, when permits or read holds head the queue, each of
// them in Info.Holds (see inspectShared). It changes nothing. etcd
// reports whole seconds: the lease ends within Info.TTL.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	info, _, err := b.inspect(ctx, key)
	if errors.Is(err, errSharedHead) {
		info, _, err = b.inspectShared(ctx, key)
	}
	return info, err
}

// ForceRelease implements dlock.ForceReleaser: it deletes the entry
// heading the lock's queue, whoever holds it (every permit or read hold,
// when those hold the key), and returns what it removed (Held false when
// free). The next waiters then hold the key; the former holders' Backends
// report the leases lost.
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	for range maxCAS {
		info, head, err := b.inspect(ctx, key)
		if errors.Is(err, errSharedHead) {
			return b.forceReleaseShared(ctx, key)
		}
		if err != nil || head == nil {
			return info, err
		}
		resp, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(string(head.Key)), "=", head.CreateRevision)).
			Then(clientv3.OpDelete(string(head.Key))).
			Commit()
		if err != nil {
			return dlock.Info{}, fmt.Errorf("etcdlock: force release %q: %w", key, rpcErr(ctx, err))
		}
		if resp.Succeeded {
			b.entryGone(string(head.Key), head.CreateRevision,
				fmt.Errorf("etcdlock: lock %q was force-released: %w", key, dlock.ErrNotHeld))
			return info, nil
		}
		// The holder changed meanwhile: look again.
	}
	return dlock.Info{}, fmt.Errorf("etcdlock: force release %q: the holder changed %d times in a row, giving up", key, maxCAS)
}

// inspect reads the state of the lock key and returns it with the
// holder's entry (nil when free).
func (b *Backend) inspect(ctx context.Context, key string) (dlock.Info, *mvccpb.KeyValue, error) {
	if err := b.checkName(dlock.Request{Key: key, Token: "-"}); err != nil {
		return dlock.Info{}, nil, err
	}
	dir := b.dir(key)
	resp, err := b.cli.Txn(ctx).
		Then(clientv3.OpGet(dir, clientv3.WithFirstCreate()...),
			clientv3.OpGet(dir, clientv3.WithPrefix(), clientv3.WithCountOnly())).
		Commit()
	if err != nil {
		return dlock.Info{}, nil, fmt.Errorf("etcdlock: inspect %q: %w", key, rpcErr(ctx, err))
	}
	info := dlock.Info{Key: key}
	head := resp.Responses[0].GetResponseRange().Kvs
	if len(head) == 0 {
		return info, nil, nil
	}
	kv := head[0]
	if k, _ := kindOf(dir, string(kv.Key)); k != dlock.KindLock {
		return dlock.Info{}, nil, errSharedHead
	}
	count, token, value, ok := decodeEntry(kv.Value)
	if !ok {
		return dlock.Info{}, nil, errWrongType(string(kv.Key))
	}
	info.Held, info.Owner, info.Fence, info.Count, info.Value = true, token, uint64(kv.CreateRevision), count, value
	info.Waiters = int(resp.Responses[1].GetResponseRange().Count) - 1
	if kv.Lease != 0 {
		tr, err := b.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return dlock.Info{}, nil, fmt.Errorf("etcdlock: inspect %q: lease %x: %w", key, kv.Lease, err)
		}
		if tr.TTL >= 0 { // -1: expired, the entry goes with it
			// etcd rounds down to whole seconds: report the upper end,
			// which a lease never renewed beyond its TTL does not pass.
			upper := tr.TTL + 1
			if tr.TTL < tr.GrantedTTL {
				upper = min(upper, tr.GrantedTTL)
			}
			info.TTL = time.Duration(upper) * time.Second
		}
	}
	return info, kv, nil
}
