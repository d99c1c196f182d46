package etcdlock

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// bump adds delta to the hold count of the entry name created at fence,
// deleting it when the count reaches zero, by compare-and-swap on its mod
// revision. count and mod are the last known state (mod 0: unknown, read
// it first). It returns the new count and mod revision, and whether the
// entry was deleted; an error matching dlock.ErrNotHeld if the entry is
// gone or was created again.
func (b *Backend) bump(ctx context.Context, name, key, token string, fence int64, count int, mod int64, delta int) (int, int64, bool, error) {
	for range maxCAS {
		if mod != 0 {
			n := count + delta
			op := clientv3.OpDelete(name)
			if n > 0 {
				op = clientv3.OpPut(name, encodeValue(n, token), clientv3.WithIgnoreLease())
			}
			resp, err := b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(name), "=", fence),
					clientv3.Compare(clientv3.ModRevision(name), "=", mod)).
				Then(op).
				Else(clientv3.OpGet(name)).
				Commit()
			if err != nil {
				if n > 0 && delta < 0 {
					// A lowered count may have been written: lowering it
					// again could take another holder's count.
					return 0, 0, false, fmt.Errorf("etcdlock: lock %q: %w: %w", key, rpcErr(ctx, err), errLowerUnknown)
				}
				return 0, 0, false, fmt.Errorf("etcdlock: lock %q: %w", key, rpcErr(ctx, err))
			}
			if resp.Succeeded {
				return max(n, 0), resp.Header.Revision, n <= 0, nil
			}
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != fence {
				return 0, 0, false, errNotHeld(key)
			}
			c, t, ok := decodeValue(kvs[0].Value)
			if !ok || (token != "" && t != token) {
				return 0, 0, false, errWrongType(name)
			}
			count, token, mod = c, t, kvs[0].ModRevision
			continue
		}
		resp, err := b.cli.Get(ctx, name)
		if err != nil {
			return 0, 0, false, fmt.Errorf("etcdlock: lock %q: %w", key, rpcErr(ctx, err))
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != fence {
			return 0, 0, false, errNotHeld(key)
		}
		c, t, ok := decodeValue(resp.Kvs[0].Value)
		if !ok || (token != "" && t != token) {
			return 0, 0, false, errWrongType(name)
		}
		count, token, mod = c, t, resp.Kvs[0].ModRevision
	}
	return 0, 0, false, fmt.Errorf("etcdlock: lock %q: hold count changed %d times in a row, giving up", key, maxCAS)
}

// errLowerUnknown marks a failed bump whose lowered hold count may have
// been written (its reply was lost): it must not be tried again, since a
// count of an owner's entry is not tagged with its holder, and a second
// decrement would take the hold of another Backend of the same owner. If
// it was not written, the count is a leftover, bounded like a lost
// re-entry's (see the package documentation, Reentrancy).
var errLowerUnknown = errors.New("the lowered hold count may have been written")

// deleteEntry deletes the entry name if it is still the incarnation
// created at fence; never a newer one (etcd issue #22082).
func (b *Backend) deleteEntry(ctx context.Context, key, name string, fence int64) error {
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(name), "=", fence)).
		Then(clientv3.OpDelete(name)).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdlock: release %q: %w", key, rpcErr(ctx, err))
	}
	if !resp.Succeeded {
		return errNotHeld(key)
	}
	return nil
}

// Release implements dlock.Backend: it gives up one hold of the grant
// r.Fence, or of any grant of r.Token if r.Fence is 0 (an owner's entry
// has its count lowered, and is deleted at zero), and returns an error
// matching dlock.ErrNotHeld, changing nothing, when the entry is gone, is
// another incarnation or holds another kind than r.Kind. A writer's
// withdrawal (r.Waiting with Fence 0) returns dlock.ErrNotHeld at once:
// a queued writer's claim is its entry, which its Wait removes.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if err := b.checkName(r); err != nil {
		return err
	}
	if (r.Waiting && r.Fence == 0 && r.Kind == dlock.KindLock) || b.wrongKind(r) {
		// A writer's withdrawn claim (a queued writer's entry is its
		// claim, removed by its Wait), or a hold of another kind.
		return errNotHeld(r.Key)
	}
	name, fence := b.nameOf(r.Key, r.Token), fenceRev(r.Fence)
	if r.Fence == 0 {
		// No fence: whichever grant the token holds.
		var err error
		if fence, err = b.currentFence(ctx, r.Key, name); err != nil {
			return err
		}
	}
	b.mu.Lock()
	h := b.holds.byName[name]
	if h != nil && h.fence != fence {
		h = nil
	}
	var count int
	var mod int64
	if h != nil {
		count, mod = int(h.count), h.mod
		if h.claims <= 1 {
			h.releasing = true // our own deletion is not a loss
		}
	}
	b.mu.Unlock()

	var (
		err     error
		deleted bool
		n       int
	)
	if r.Reentrant {
		n, mod, deleted, err = b.bump(ctx, name, r.Key, r.Token, fence, count, mod, -1)
	} else {
		err = b.deleteEntry(ctx, r.Key, name, fence)
		deleted = err == nil
	}
	gone := deleted || errors.Is(err, dlock.ErrNotHeld)

	b.mu.Lock()
	var lost lossList
	if h != nil && b.holds.byName[name] == h {
		h.claims--
		h.releasing = false
		switch {
		case err == nil && !deleted:
			if mod > h.mod {
				h.setCount(n, mod)
			}
		case gone && h.claims > 0:
			// The entry vanished under other holds of the same owner.
			lost = b.markLostLocked(h, errNotHeld(r.Key))
		case !gone && h.claims <= 0 && !errors.Is(err, errLowerUnknown):
			b.orphanLocked(name, fence, 1)
			b.sweepLocked()
		}
		if deleted && h.lease.private && b.leases.spare[h.lease.sec] == nil && h.lease.dead == nil {
			b.leases.spare[h.lease.sec] = h.lease // it carried only this entry
		}
		if gone || h.claims <= 0 {
			b.dropHoldLocked(h)
		}
	}
	b.mu.Unlock()
	lost.fire()
	return err
}

// currentFence returns the create revision of the entry name of the lock
// key, or an error matching dlock.ErrNotHeld if there is none.
func (b *Backend) currentFence(ctx context.Context, key, name string) (int64, error) {
	resp, err := b.cli.Get(ctx, name, clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("etcdlock: lock %q: %w", key, rpcErr(ctx, err))
	}
	if len(resp.Kvs) == 0 {
		return 0, errNotHeld(key)
	}
	return resp.Kvs[0].CreateRevision, nil
}
