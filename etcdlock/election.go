package etcdlock

import (
	"context"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// encodeEntry is the value of an entry: "COUNT TOKEN" (encodeValue)
// without a leader's value, else "COUNT/LEN TOKEN VALUE" with LEN the
// token's length and no separator between TOKEN and VALUE (see
// decodeEntry).
func encodeEntry(count int, token, value string) string {
	if value == "" {
		return encodeValue(count, token)
	}
	return strconv.Itoa(count) + "/" + strconv.Itoa(len(token)) + " " + token + value
}

// entryValue is the value a new entry of r is created with: one hold of
// r.Token, with r.Value for a lock (an elected leader's value).
func entryValue(r dlock.Request) string {
	if r.Kind != dlock.KindLock {
		return encodeValue(1, r.Token)
	}
	return encodeEntry(1, r.Token, r.Value)
}

// SetValue implements dlock.Proclaimer: it replaces the value kept with
// the lock r.Key's entry of r.Token, created at r.Fence, by r.Value (one
// transaction, compare-and-swap on the entry's mod revision, keeping its
// lease and hold count). It returns an error matching dlock.ErrNotHeld,
// changing nothing, when that entry is gone or is another incarnation.
func (b *Backend) SetValue(ctx context.Context, r dlock.Request) error {
	if err := b.checkName(r); err != nil {
		return err
	}
	if r.Kind != dlock.KindLock || b.wrongKind(r) {
		return errNotHeld(r.Key)
	}
	name, fence := b.nameOf(r.Key, r.Token), fenceRev(r.Fence)
	count, mod := 0, int64(0)
	b.mu.Lock()
	if h := b.holds.byName[name]; h != nil && h.fence == fence {
		if h.lost != nil {
			b.mu.Unlock()
			return h.lost
		}
		count, mod = int(h.count), h.mod
	}
	b.mu.Unlock()
	for range maxCAS {
		if mod == 0 || count < 1 {
			resp, err := b.cli.Get(ctx, name)
			if err != nil {
				return fmt.Errorf("etcdlock: proclaim %q: %w", r.Key, rpcErr(ctx, err))
			}
			if len(resp.Kvs) == 0 || (fence != 0 && resp.Kvs[0].CreateRevision != fence) {
				return errNotHeld(r.Key)
			}
			c, t, ok := decodeValue(resp.Kvs[0].Value)
			if !ok || t != r.Token {
				return errNotHeld(r.Key)
			}
			count, mod, fence = c, resp.Kvs[0].ModRevision, resp.Kvs[0].CreateRevision
		}
		resp, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(name), "=", fence),
				clientv3.Compare(clientv3.ModRevision(name), "=", mod)).
			Then(clientv3.OpPut(name, encodeEntry(count, r.Token, r.Value), clientv3.WithIgnoreLease())).
			Commit()
		if err != nil {
			return fmt.Errorf("etcdlock: proclaim %q: %w", r.Key, rpcErr(ctx, err))
		}
		if resp.Succeeded {
			b.mu.Lock()
			if h := b.holds.byName[name]; h != nil && h.fence == fence && resp.Header.Revision > h.mod {
				h.mod = resp.Header.Revision
			}
			b.mu.Unlock()
			return nil
		}
		mod = 0 // changed meanwhile: read it again
	}
	return fmt.Errorf("etcdlock: proclaim %q: the entry changed %d times in a row, giving up", r.Key, maxCAS)
}
