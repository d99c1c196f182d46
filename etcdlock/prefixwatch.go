package etcdlock

import (
	"context"
	"fmt"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// Many held locks: one prefix watch instead of a watch per lock.
//
// A deletion watch per held lock costs, besides the etcd server's watcher,
// a goroutine and buffers in the etcd client (about 10 KB of heap and
// stack per lock) and one round trip to create it: 100,000 held locks
// meant 100,000 watch creations, serialized on one gRPC stream. With at
// least prefixWatchMin held locks, a Backend instead watches its whole
// key prefix for deletions, once, and routes each DELETE event to the
// held lock whose entry it deleted: a deletion of name at revision D ends
// the hold of name if D ≥ the hold's from (the first revision after one
// at which the entry was seen to exist; the first deletion after that can
// only delete that incarnation, and a later incarnation of the name is
// only ever created after it). A hold granted meanwhile needs no watch of
// its own when its from is at or after the prefix watch's start revision
// (the usual case: the prefix watch starts at the oldest from among the
// held locks whose own watch has not started yet); one with an earlier
// from (its grant's reply came late) gets its own watch as below the
// threshold, and locks whose own watch already runs when the prefix watch
// starts keep it.
//
// A prefix watch also receives every other client's deletions under the
// prefix (queue entries, releases), so a Backend that holds few locks
// keeps the per-lock watches: it switches to the prefix watch at
// prefixWatchMin held locks and back below prefixWatchMin/4 (hysteresis,
// so that a count around the threshold does not recreate watches over and
// over). Switching back starts a watch per remaining lock from the
// revision the prefix watch had handled.
//
// If the prefix watch ends (its start revision was compacted while the
// client reconnected, the server cancelled it, the client closed), every
// held lock is read again (at most maxTxnOps per transaction: etcd's
// default --max-txn-ops) and those gone are reported lost; a new prefix
// watch then starts after the first read's revision. Holds granted during
// the reads get their own watches.

// maxTxnOps is etcd's default limit of operations in one transaction.
const maxTxnOps = 128

// prefixWatch is the Backend's deletion watch over its whole prefix.
// Guarded by Backend.mu.
type prefixWatch struct {
	cancel context.CancelFunc
	// from is the first revision whose deletions the watch reports
	// (math.MaxInt64 while the held locks are read again).
	from int64
	// next: the deletions before it have been handled.
	next int64
}

// coveredLocked reports whether h needs no watch of its own: the prefix watch
// reports every deletion from h.from on. b.mu must be held.
func (b *Backend) coveredLocked(h *held) bool {
	return b.holds.pw != nil && h.from >= b.holds.pw.from
}

// prefixUpLocked switches to the prefix watch if enough locks are held.
// The prefix watch starts at the oldest from among the held locks without
// a running watch of their own (those granted in the last lossWatchDelay,
// or whose watch is being restarted), and takes over from their pending
// watches; locks whose own watch runs keep it (fewer than
// prefixWatchMin), so that the prefix watch does not replay from the
// grant of a lock held for days every other client's deletions since
// then. b.mu must be held.
func (b *Backend) prefixUpLocked() {
	if b.holds.pw != nil || b.closed || len(b.holds.byName) < b.tune.prefixWatchMin {
		return
	}
	from := int64(math.MaxInt64)
	for _, h := range b.holds.byName {
		if h.lost == nil && (h.own == nil || h.own.cancel == nil) {
			from = min(from, h.from)
		}
	}
	if from == math.MaxInt64 {
		return
	}
	b.startPrefixLocked(from)
	for _, h := range b.holds.byName {
		if b.coveredLocked(h) {
			b.stopWatchLocked(h)
		}
	}
}

// startPrefixLocked starts the prefix watch from revision from. b.mu must
// be held.
func (b *Backend) startPrefixLocked(from int64) {
	ctx, cancel := context.WithCancel(b.ctx)
	pw := &prefixWatch{cancel: cancel, from: from, next: from}
	b.holds.pw = pw
	b.wg.Add(1)
	go b.prefixLoop(ctx, pw)
}

// prefixDownLocked switches back to per-lock watches if few locks are
// held. b.mu must be held.
func (b *Backend) prefixDownLocked() {
	if b.holds.pw == nil || len(b.holds.byName) >= b.tune.prefixWatchMin/4 {
		return
	}
	pw := b.holds.pw
	b.holds.pw = nil
	pw.cancel()
	for _, h := range b.holds.byName {
		if h.lost == nil && h.own == nil {
			// The deletions before pw.next were handled.
			b.watchLaterLocked(h, max(h.from, pw.next), 0)
		}
	}
}

// prefixLoop serves the prefix watch pw until it is stopped or ends;
// then it reads the held locks again and starts another.
func (b *Backend) prefixLoop(ctx context.Context, pw *prefixWatch) {
	defer b.wg.Done()
	wch := b.cli.Watch(ctx, b.prefix, clientv3.WithPrefix(), clientv3.WithRev(pw.from), clientv3.WithFilterPut())
	for resp := range wch {
		if resp.Canceled || resp.Err() != nil {
			break
		}
		b.onPrefix(pw, resp)
	}
	pw.cancel()
	b.mu.Lock()
	ended := b.holds.pw == pw && !b.closed
	if ended {
		pw.from = math.MaxInt64 // holds granted from now on watch themselves
	}
	b.mu.Unlock()
	if ended {
		b.reread(pw)
	}
}

// onPrefix routes the deletions of one response of the prefix watch to
// the held locks they end.
func (b *Backend) onPrefix(pw *prefixWatch, resp clientv3.WatchResponse) {
	var lost lossList
	b.mu.Lock()
	for _, ev := range resp.Events {
		if ev.Type != mvccpb.DELETE {
			continue
		}
		h := b.holds.byName[string(ev.Kv.Key)]
		if h == nil || h.releasing || ev.Kv.ModRevision < h.from {
			continue // not ours, our own release, or an older incarnation
		}
		lost = append(lost, b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q: key %s deleted at revision %d (lease expired or revoked, or key deleted): %w",
			h.key, h.name, ev.Kv.ModRevision, dlock.ErrNotHeld))...)
	}
	if b.holds.pw == pw {
		if n := len(resp.Events); n > 0 {
			pw.next = max(pw.next, resp.Events[n-1].Kv.ModRevision+1)
		} else if !resp.Created && resp.Header.Revision > 0 {
			pw.next = max(pw.next, resp.Header.Revision+1) // progress
		}
	}
	b.mu.Unlock()
	lost.fire()
}

// reread reads every lock held when the prefix watch pw ended, reports
// those gone lost, and starts a new prefix watch after the first read's
// revision, unless the Backend switched back to per-lock watches or
// closed meanwhile. A read that fails is retried every second while the
// Backend is open; if the etcd client was closed, every lock is lost.
func (b *Backend) reread(pw *prefixWatch) {
	b.mu.Lock()
	hs := make([]*held, 0, len(b.holds.byName))
	for _, h := range b.holds.byName {
		if h.lost == nil {
			hs = append(hs, h)
		}
	}
	b.mu.Unlock()
	var first int64
	for len(hs) > 0 {
		chunk := hs[:min(len(hs), maxTxnOps)]
		ops := make([]clientv3.Op, len(chunk))
		for i, h := range chunk {
			ops[i] = clientv3.OpGet(h.name, clientv3.WithKeysOnly())
		}
		ctx, cancel := context.WithTimeout(b.ctx, cleanupTimeout)
		resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			if b.ctx.Err() != nil {
				return
			}
			if b.cli.Ctx().Err() != nil {
				// The etcd client was closed: nothing can be renewed.
				b.mu.Lock()
				var lost lossList
				for _, h := range b.holds.byName {
					lost = append(lost, b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q: etcd client closed: %w", h.key, dlock.ErrNotHeld))...)
				}
				b.mu.Unlock()
				lost.fire()
				return
			}
			select {
			case <-b.ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if first == 0 {
			first = resp.Header.Revision
		}
		var lost lossList
		b.mu.Lock()
		for i, h := range chunk {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if b.holds.byName[h.name] == h && !h.releasing && (len(kvs) == 0 || kvs[0].CreateRevision != h.fence) {
				lost = append(lost, b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q: key %s is gone: %w", h.key, h.name, dlock.ErrNotHeld))...)
			}
		}
		b.mu.Unlock()
		lost.fire()
		hs = hs[len(chunk):]
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holds.pw != pw || b.closed {
		return // switched back (each lock has its watch) or closed
	}
	if first == 0 {
		// Nothing was held: no watch until enough locks are held again.
		b.holds.pw = nil
		b.prefixUpLocked()
		return
	}
	b.startPrefixLocked(first + 1)
}
