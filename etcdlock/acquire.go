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

// TryAcquire implements dlock.Backend: if nobody holds or waits for the
// lock it creates the owner's entry (one transaction); otherwise it
// returns Grant{OK: false}, writing nothing, or re-enters for an owner
// that holds the lock. A permit or read request is tryKind's.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	start := time.Now()
	sec, err := b.check(r)
	if err != nil {
		return dlock.Grant{}, err
	}
	if r.Kind != dlock.KindLock {
		return b.tryKind(ctx, r, sec, start)
	}
	b.clearOrphans(ctx, b.dir(r.Key))
	name := b.claimName(r)
	for attempt := 1; ; attempt++ {
		g, retry, err := b.tryOnce(ctx, r, name, sec, start)
		if retry && attempt < maxLeaseRetries {
			continue
		}
		if err != nil || !g.OK {
			b.unclaim(r, name)
		}
		return g, err
	}
}

// maxLeaseRetries bounds the attempts of TryAcquire when the lease it
// used turns out gone (expired or revoked): each retry grants a new lease.
const maxLeaseRetries = 3

// tryOnce is one attempt of TryAcquire with the entry name. retry reports
// that the lease used was found gone and nothing is held.
func (b *Backend) tryOnce(ctx context.Context, r dlock.Request, name string, sec int64, start time.Time) (g dlock.Grant, retry bool, err error) {
	ls, err := b.leaseOf(ctx, r, sec)
	if err != nil {
		return dlock.Grant{}, false, err
	}
	// The Client counts a TryAcquire grant from the start of its call
	// (Grant.Since counts only for a queue wait's grant): the lock must
	// live on the server for its lifetime from start. The lease is renewed
	// concurrently with the transaction, unless it was renewed since the
	// call began, or at most TTL/10 before it: then the lock's lifetime
	// is what is left of the lease from start (Grant.TTL, see lifeFrom).
	life, reuse := b.lifeFrom(ls, start, r.TTL)
	wait := func() error { return nil }
	if !reuse {
		wait = b.startFresh(ctx, ls, start, r.TTL)
	}
	floor := b.heldFence(name)
	dir := b.dir(r.Key)
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithPrefix()).
		Then(clientv3.OpPut(name, entryValue(r), clientv3.WithLease(ls.id))).
		Else(clientv3.OpGet(name), clientv3.OpGet(dir, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)).
		Commit()
	kaErr := wait()
	if isLeaseNotFound(err) {
		b.leaseGone(ls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(ls.id), dlock.ErrNotHeld))
		return dlock.Grant{}, true, fmt.Errorf("etcdlock: acquire %q: %w", r.Key, err)
	}
	if err != nil {
		// The transaction may have been applied (its reply lost, or ctx
		// ended meanwhile): remove the entry it would have created.
		b.dropCreated(ctx, name, ls, entryValue(r), floor)
		return dlock.Grant{}, false, fmt.Errorf("etcdlock: acquire %q: %w", r.Key, rpcErr(ctx, err))
	}
	if resp.Succeeded {
		fence := resp.Header.Revision
		if kaErr != nil {
			// The entry exists, but its lease may end before the
			// Client's lease would: take it back (only our claim: another
			// Backend of the same owner may have joined it meanwhile).
			b.abandon(ctx, r.Key, name, fence, r.Reentrant)
			return dlock.Grant{}, b.dead(ls), kaErr
		}
		b.addHold(name, r.Key, r.Token, fence, ls, 1, fence, fence+1)
		return dlock.Grant{OK: true, Fence: uint64(fence), Count: 1, TTL: life}, false, nil
	}
	b.putSpare(ls) // nothing was attached to it
	own := resp.Responses[0].GetResponseRange().Kvs
	head := resp.Responses[1].GetResponseRange().Kvs
	if len(own) > 0 {
		_, token, ok := decodeValue(own[0].Value)
		switch {
		case !r.Reentrant && (!ok || token != r.Token):
			// A leftover of an earlier use of our slot: ours to remove.
			b.retireSlot(r, name, own[0].CreateRevision)
		case !ok || token != r.Token:
			return dlock.Grant{}, false, errWrongType(name)
		case len(head) > 0 && string(head[0].Key) == name:
			if !r.Reentrant {
				return dlock.Grant{}, false, errTokenInUse(r.Key)
			}
			g, err := b.reenter(ctx, r, own[0], sec, start)
			return g, false, err
		}
		// Queued by a concurrent Wait of the same owner: not granted.
	}
	if len(head) > 0 {
		g.HolderTTL = b.holderTTL(clientv3.LeaseID(head[0].Lease))
	}
	return g, false, nil
}

// heldFence returns the fence of the entry name if the Backend holds it,
// else 0: an entry a new attempt creates under that name has a higher
// create revision.
func (b *Backend) heldFence(name string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.holds.byName[name]; h != nil {
		return h.fence
	}
	return 0
}

// reenter raises the hold count of the owner's entry kv, which heads the
// queue, makes the entry live for r.TTL (see fitEntry) and returns the
// grant. A raise whose reply is lost is left on the server (see the
// package documentation, Reentrancy).
func (b *Backend) reenter(ctx context.Context, r dlock.Request, kv *mvccpb.KeyValue, sec int64, start time.Time) (dlock.Grant, error) {
	name := string(kv.Key)
	count, _, _ := decodeValue(kv.Value)
	n, mod, _, err := b.bump(ctx, name, r.Key, r.Token, kv.CreateRevision, count, kv.ModRevision, +1)
	if errors.Is(err, dlock.ErrNotHeld) {
		return dlock.Grant{}, nil // the entry went meanwhile: not granted
	}
	if err != nil {
		return dlock.Grant{}, err
	}
	ls, err := b.fitEntry(ctx, r, name, kv.CreateRevision, sec, start)
	if err != nil {
		b.abandon(ctx, r.Key, name, kv.CreateRevision, true)
		if errors.Is(err, dlock.ErrNotHeld) {
			return dlock.Grant{}, nil
		}
		return dlock.Grant{}, err
	}
	b.addHold(name, r.Key, r.Token, kv.CreateRevision, ls, n, mod, mod)
	return dlock.Grant{OK: true, Fence: uint64(kv.CreateRevision), Count: n}, nil
}

// holderTTL returns the remaining validity of lease id if it is one of the
// Backend's own leases, else 0.
func (b *Backend) holderTTL(id clientv3.LeaseID) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ls := range b.leases.shared {
		if ls.isReady() && ls.err == nil && ls.id == id {
			return max(time.Until(ls.validUntil), 0)
		}
	}
	return 0
}
