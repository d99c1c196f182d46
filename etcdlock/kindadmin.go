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

// errSharedHead tells Inspect and ForceRelease that the entry heading a
// queue is a permit or read hold: the key's holders are read by
// inspectShared.
var errSharedHead = errors.New("etcdlock: a permit or read hold heads the queue")

// inspectShared reads the permit or read holds of key: the whole
// directory in one request, sorted by create revision, and one TimeToLive
// per distinct lease of the holders. The holders are the readers ahead of
// the first lock entry, or the first Permits permits (or, if a lock
// heads the queue by the time of the read, its holder, as inspect reports
// it); the others wait. It returns the info and the holders' entries.
func (b *Backend) inspectShared(ctx context.Context, key string) (dlock.Info, []*mvccpb.KeyValue, error) {
	dir := b.dir(key)
	resp, err := b.cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return dlock.Info{}, nil, fmt.Errorf("etcdlock: inspect %q: %w", key, rpcErr(ctx, err))
	}
	info := dlock.Info{Key: key}
	if len(resp.Kvs) == 0 {
		return info, nil, nil
	}
	info.Kind, info.Permits = kindOf(dir, string(resp.Kvs[0].Key))
	var holders []*mvccpb.KeyValue
	for _, kv := range resp.Kvs {
		k, n := kindOf(dir, string(kv.Key))
		if k != info.Kind || n != info.Permits || (k == dlock.KindPermit && len(holders) == n) {
			break
		}
		holders = append(holders, kv)
	}
	info.Held, info.Waiters = true, len(resp.Kvs)-len(holders)
	if info.Kind == dlock.KindLock {
		// A lock heads the queue after all (the shared holds left
		// meanwhile): its holder, as inspect reports it.
		kv := resp.Kvs[0]
		count, token, value, ok := decodeEntry(kv.Value)
		if !ok {
			return dlock.Info{}, nil, errWrongType(string(kv.Key))
		}
		info.Owner, info.Fence, info.Count, info.Value = token, uint64(kv.CreateRevision), count, value
		info.Waiters = len(resp.Kvs) - 1
		if kv.Lease != 0 {
			if info.TTL, err = b.leaseTTL(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
				return dlock.Info{}, nil, fmt.Errorf("etcdlock: inspect %q: %w", key, err)
			}
		}
		return info, resp.Kvs[:1], nil
	}
	ttls := make(map[int64]time.Duration)
	for _, kv := range holders {
		_, token, ok := decodeValue(kv.Value)
		if !ok {
			return dlock.Info{}, nil, errWrongType(string(kv.Key))
		}
		ttl, seen := ttls[kv.Lease]
		if !seen && kv.Lease != 0 {
			if ttl, err = b.leaseTTL(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
				return dlock.Info{}, nil, fmt.Errorf("etcdlock: inspect %q: %w", key, err)
			}
			ttls[kv.Lease] = ttl
		}
		info.Holds = append(info.Holds, dlock.Hold{Owner: token, Fence: uint64(kv.CreateRevision), TTL: ttl})
	}
	return info, holders, nil
}

// leaseTTL returns the remaining TTL of lease id as Inspect reports it:
// etcd's whole seconds rounded up (at most the granted TTL), 0 if the
// lease expired.
func (b *Backend) leaseTTL(ctx context.Context, id clientv3.LeaseID) (time.Duration, error) {
	tr, err := b.cli.TimeToLive(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("lease %x: %w", int64(id), rpcErr(ctx, err))
	}
	if tr.TTL < 0 {
		return 0, nil
	}
	upper := tr.TTL + 1
	if tr.TTL < tr.GrantedTTL {
		upper = min(upper, tr.GrantedTTL)
	}
	return time.Duration(upper) * time.Second, nil
}

// forceReleaseShared deletes every permit or read hold of key, each if
// still the incarnation read, and returns what it removed. Their holders'
// Backends report them lost; waiters move up.
func (b *Backend) forceReleaseShared(ctx context.Context, key string) (dlock.Info, error) {
	info, holders, err := b.inspectShared(ctx, key)
	if err != nil {
		return dlock.Info{}, err
	}
	for _, kv := range holders {
		name := string(kv.Key)
		err := b.deleteEntry(ctx, key, name, kv.CreateRevision)
		switch {
		case err == nil:
			b.entryGone(name, kv.CreateRevision, fmt.Errorf("etcdlock: lock %q was force-released: %w", key, dlock.ErrNotHeld))
		case !errors.Is(err, dlock.ErrNotHeld):
			return dlock.Info{}, fmt.Errorf("etcdlock: force release %q: %w", key, err)
		}
	}
	return info, nil
}
