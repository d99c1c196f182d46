package etcdlock

import (
	"context"
	"errors"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// orphanSet is the entries the Backend no longer tracks but could not
// remove from the server yet. Guarded by Backend.mu.
type orphanSet struct {
	byName   map[string]orphan   // by etcd key
	busy     map[string]struct{} // being removed right now
	sweeping bool                // sweepLoop runs
	expired  int                 // sweepLoop rounds that ran out of cleanupTimeout
}

// orphan is a claim on an entry the Backend no longer tracks but could
// not remove from the server yet. With fence 0 the entry's creation had an
// unknown outcome: it is deleted only if it still has lease and value.
type orphan struct {
	fence  int64
	claims int
	lease  clientv3.LeaseID
	value  string
	floor  int64 // fence 0: the entry was created after this revision
}

// abandon removes one claim on the entry name (a queue entry given up or
// a grant taken back) with a fresh context derived from ctx, bounded by
// abandonTimeout; when the server cannot be reached the entry is kept as
// an orphan and removed later.
func (b *Backend) abandon(ctx context.Context, key, name string, fence int64, reentrant bool) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	var err error
	if reentrant {
		_, _, _, err = b.bump(cctx, name, key, "", fence, 0, 0, -1)
	} else {
		err = b.deleteEntry(cctx, key, name, fence)
	}
	if err != nil && !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrWrongType) && !errors.Is(err, errLowerUnknown) {
		b.mu.Lock()
		b.orphanLocked(name, fence, 1)
		b.sweepLocked()
		b.mu.Unlock()
	}
}

// retireSlot gives up r's slot name, found taken by an entry created at
// fence that r did not create: a leftover of an earlier acquisition
// through this Backend (only this Backend uses its slot names) that was
// not known to exist. It is deleted in the background; r gets another
// slot from claimName.
func (b *Backend) retireSlot(r dlock.Request, name string, fence int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.names.slots[name]; s != nil && s.token == r.Token {
		b.freeSlotLocked(r.Key, name)
	}
	if _, ok := b.orphans.byName[name]; !ok {
		b.orphanLocked(name, fence, 1)
	}
	b.sweepLocked()
}

// dropCreated deletes the entry name if it is exactly as a create
// transaction with an unknown outcome, on lease ls, would have left it:
// on ls, with value (what the attempt wrote: "1 TOKEN", see entryValue),
// created after revision floor (after any entry of an earlier grant under
// that name). It uses a fresh context
// derived from ctx, bounded by abandonTimeout; when the server cannot be
// reached the entry is kept as an orphan and removed later.
func (b *Backend) dropCreated(ctx context.Context, name string, ls *leaseState, value string, floor int64) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	if err := b.deleteIfCreated(cctx, name, ls.id, value, floor); err != nil {
		b.mu.Lock()
		b.orphans.byName[name] = orphan{lease: ls.id, value: value, floor: floor, claims: 1}
		b.sweepLocked()
		b.mu.Unlock()
	}
}

// deleteIfCreated deletes the entry name if it is on lease id, has value
// and was created after revision floor.
func (b *Backend) deleteIfCreated(ctx context.Context, name string, id clientv3.LeaseID, value string, floor int64) error {
	_, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(name), "=", id),
			clientv3.Compare(clientv3.Value(name), "=", value),
			clientv3.Compare(clientv3.CreateRevision(name), ">", floor)).
		Then(clientv3.OpDelete(name)).
		Commit()
	return err
}

// orphanLocked records a claim on name (created at fence) to delete
// later. b.mu must be held.
func (b *Backend) orphanLocked(name string, fence int64, claims int) {
	o := b.orphans.byName[name]
	if o.fence != fence {
		o = orphan{fence: fence}
	}
	o.claims += claims
	b.orphans.byName[name] = o
}

// sweepLocked starts the background removal of the orphans unless it is
// running. It makes a pass over the orphans and, while some remain (the
// server unreachable), another after sweepMinDelay, doubling up to
// sweepMaxDelay (back to the minimum after a pass that removed one),
// until none remain or the Backend closes: an orphan on the Backend's
// lease would otherwise live as long as the Backend renews that lease for
// its other entries, and, heading a queue, stall it. b.mu must be held.
func (b *Backend) sweepLocked() {
	if b.closed || len(b.orphans.byName) == 0 {
		return
	}
	b.startLocked(&b.orphans.sweeping, b.sweepLoop)
}

// sweepLoop is the background removal started by sweepLocked.
func (b *Backend) sweepLoop() {
	defer b.wg.Done()
	delay := sweepMinDelay
	for {
		ctx, cancel := context.WithTimeout(b.ctx, cleanupTimeout)
		progress := b.removeOrphans(ctx, "")
		expired := errors.Is(ctx.Err(), context.DeadlineExceeded)
		cancel()
		b.mu.Lock()
		if expired {
			b.orphans.expired++
		}
		if b.closed || len(b.orphans.byName) == 0 {
			b.orphans.sweeping = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		if progress {
			delay = sweepMinDelay
		}
		t := time.NewTimer(delay)
		select {
		case <-b.ctx.Done():
			t.Stop()
			b.mu.Lock()
			b.orphans.sweeping = false
			b.mu.Unlock()
			return
		case <-t.C:
		}
		delay = min(2*delay, sweepMaxDelay)
	}
}

// removeOrphans makes one attempt at removing each orphan whose name
// starts with dir ("": all) and that no other call is removing at the
// moment (a reentrant orphan's claims must be taken off its hold count
// once). It reports whether it removed any.
func (b *Backend) removeOrphans(ctx context.Context, dir string) (progress bool) {
	b.mu.Lock()
	todo := make(map[string]orphan)
	for name, o := range b.orphans.byName {
		if _, busy := b.orphans.busy[name]; busy || !strings.HasPrefix(name, dir) {
			continue
		}
		todo[name] = o
		b.orphans.busy[name] = struct{}{}
	}
	b.mu.Unlock()
	for name, o := range todo {
		var err error
		if o.fence == 0 {
			err = b.deleteIfCreated(ctx, name, o.lease, o.value, o.floor)
		} else {
			_, _, _, err = b.bump(ctx, name, name, "", o.fence, 0, 0, -o.claims)
		}
		// errLowerUnknown: the claims may be taken off already; never twice.
		done := err == nil || errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrWrongType) || errors.Is(err, errLowerUnknown)
		b.mu.Lock()
		delete(b.orphans.busy, name)
		if cur := b.orphans.byName[name]; done && cur.fence == o.fence {
			if cur.claims -= o.claims; cur.claims <= 0 {
				delete(b.orphans.byName, name)
			} else {
				b.orphans.byName[name] = cur
			}
			progress = true
		}
		b.mu.Unlock()
	}
	return progress
}

// clearOrphans removes the Backend's orphans in the lock directory dir
// before it queues there (or tries to take the lock): such an orphan is
// usually the Backend's own entry whose release failed, and it would head
// the queue, on the lease the Backend keeps renewing while it waits. One
// attempt, bounded by ctx and abandonTimeout; the background sweep retries
// what remains.
func (b *Backend) clearOrphans(ctx context.Context, dir string) {
	b.mu.Lock()
	found := false
	for name := range b.orphans.byName {
		if strings.HasPrefix(name, dir) {
			found = true
			break
		}
	}
	b.mu.Unlock()
	if !found {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, abandonTimeout)
	defer cancel()
	b.removeOrphans(cctx, dir)
	b.mu.Lock()
	b.sweepLocked()
	b.mu.Unlock()
}
