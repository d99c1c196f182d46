package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// fitEntry makes the entry name of (r.Key, r.Token), created at fence,
// live on the server until at least start + r.TTL and returns the lease
// it is on. It reads the entry (another Backend of the same owner may have
// moved it), renews its lease unless that is known valid long enough, and
// moves the entry to a new lease of sec seconds (private for an owner's
// entry, else the Backend's shared one), renewed just before, when its
// lease was granted for less than r.TTL. It returns an error matching
// dlock.ErrNotHeld when the entry is gone, is another incarnation or has
// another token.
func (b *Backend) fitEntry(ctx context.Context, r dlock.Request, name string, fence, sec int64, start time.Time) (*leaseState, error) {
	r.Reentrant = name == b.entryName(r.Key, r.Token)
	for range maxCAS {
		resp, err := b.cli.Get(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("etcdlock: lock %q: %w", r.Key, rpcErr(ctx, err))
		}
		if len(resp.Kvs) == 0 || (fence != 0 && resp.Kvs[0].CreateRevision != fence) {
			return nil, errNotHeld(r.Key)
		}
		kv := resp.Kvs[0]
		fence = kv.CreateRevision // r.Fence 0: whichever grant the token holds
		if _, token, ok := decodeValue(kv.Value); !ok || token != r.Token {
			return nil, errNotHeld(r.Key)
		}
		ls := b.entryLease(name, fence, clientv3.LeaseID(kv.Lease))
		if err := b.ensureFresh(ctx, ls, start, r.TTL); err != nil {
			return nil, err
		}
		if b.longEnough(ls, r.TTL) {
			return ls, nil
		}
		nls, err := b.leaseOf(ctx, r, sec)
		if err != nil {
			return nil, err
		}
		// Renew the longer lease right before the move, so that the entry
		// lands on a deadline later than its current one, not on one a
		// stale lease still has (the move may also be the call's last
		// request: its context may end after it).
		if err := b.keepAlive(ctx, nls); err != nil {
			if b.dead(nls) {
				continue
			}
			return nil, err
		}
		tr, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(name), "=", fence),
				clientv3.Compare(clientv3.ModRevision(name), "=", kv.ModRevision)).
			Then(clientv3.OpPut(name, "", clientv3.WithIgnoreValue(), clientv3.WithLease(nls.id))).
			Commit()
		if isLeaseNotFound(err) {
			b.leaseGone(nls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(nls.id), dlock.ErrNotHeld))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("etcdlock: lock %q: %w", r.Key, rpcErr(ctx, err))
		}
		if !tr.Succeeded {
			b.putSpare(nls)
			continue
		}
		return nls, nil
	}
	return nil, fmt.Errorf("etcdlock: lock %q: the entry changed %d times in a row, giving up", r.Key, maxCAS)
}

// Refresh implements dlock.Backend: it makes the lock live at least r.TTL
// from now (never shortening it) if the grant r.Fence (any grant of
// r.Token if 0) still holds it; see RefreshMany.
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	return b.RefreshMany(ctx, []dlock.Request{r})[0]
}

// RefreshMany implements dlock.BatchRefresher: one keep-alive per
// distinct shared lease among rs, sent concurrently, and one read and
// keep-alive per owner's entry. A lock whose entry or lease is gone gets
// an error matching dlock.ErrNotHeld.
func (b *Backend) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	errs := make([]error, len(rs))
	secs := make([]int64, len(rs))
	for i, r := range rs {
		secs[i], errs[i] = b.check(r)
	}
	groups := make(map[*leaseState][]int)
	hs := make([]*held, len(rs)) // the holds renewed by their lease
	var slow []int
	b.mu.Lock()
	for i, r := range rs {
		if errs[i] != nil {
			continue
		}
		h := b.heldLocked(r.Key, r.Token)
		switch {
		case b.wrongKindLocked(r):
			errs[i] = errNotHeld(r.Key)
		case h == nil || h.fence != fenceRev(r.Fence):
			slow = append(slow, i)
		case h.lost != nil:
			errs[i] = h.lost
		case h.lease.private || h.lease.foreign || time.Duration(h.lease.granted)*time.Second < r.TTL:
			// An owner's entry (another Backend may have moved it), or a
			// lease too short for the TTL asked: see fitEntry.
			slow = append(slow, i)
		default:
			groups[h.lease] = append(groups[h.lease], i)
			hs[i] = h
		}
	}
	if len(b.orphans.byName) > 0 {
		b.sweepLocked()
	}
	b.mu.Unlock()

	var wg sync.WaitGroup
	for ls, idx := range groups {
		renew := func() {
			err := b.keepAlive(ctx, ls)
			for _, i := range idx {
				errs[i] = err
			}
		}
		if len(groups) == 1 && len(slow) == 0 {
			renew() // the usual case: one lease, no goroutine
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			renew()
		}()
	}
	for _, i := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.refreshSlow(ctx, rs[i], secs[i])
		}()
	}
	wg.Wait()

	// A deletion seen by the watch meanwhile wins over a renewed lease.
	b.mu.Lock()
	for ls, idx := range groups {
		for _, i := range idx {
			if h := hs[i]; errs[i] == nil && h.lease == ls && h.lost != nil {
				errs[i] = h.lost
			}
		}
	}
	b.mu.Unlock()
	return errs
}

// refreshSlow refreshes a lock with fitEntry: an owner's entry, a lock
// this Backend did not grant, or one whose lease is shorter than r.TTL.
func (b *Backend) refreshSlow(ctx context.Context, r dlock.Request, sec int64) error {
	name, fence := b.nameOf(r.Key, r.Token), fenceRev(r.Fence)
	ls, err := b.fitEntry(ctx, r, name, fence, sec, time.Now())
	if errors.Is(err, dlock.ErrNotHeld) {
		b.entryGone(name, fence, err)
	}
	if err != nil {
		return fmt.Errorf("etcdlock: refresh %q: %w", r.Key, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.holds.byName[name]; h != nil && h.fence == fence {
		if h.lost != nil {
			return h.lost
		}
		h.lease = ls
	}
	return nil
}

// entryLease returns the leaseState of lease id, found under the entry
// name created at fence: the hold's own when the Backend holds the entry
// on it (the usual case, without a search), else leaseFor's.
func (b *Backend) entryLease(name string, fence int64, id clientv3.LeaseID) *leaseState {
	b.mu.Lock()
	var ls *leaseState
	if h := b.holds.byName[name]; h != nil && h.fence == fence && h.lease.id == id {
		ls = h.lease
	}
	b.mu.Unlock()
	if ls == nil {
		ls = b.leaseFor(id)
	}
	return ls
}

// entryGone marks the granted entry name (at fence) lost.
func (b *Backend) entryGone(name string, fence int64, cause error) {
	b.mu.Lock()
	var lost lossList
	if h := b.holds.byName[name]; h != nil && h.fence == fence && !h.releasing {
		lost = b.markLostLocked(h, cause)
	}
	b.mu.Unlock()
	lost.fire()
}
