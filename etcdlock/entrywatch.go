package etcdlock

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Waiters watch the entries ahead of theirs for deletion through entry
// watches: one etcd watch per entry name and Backend, shared by the
// Backend's waiters that need it and kept open for a while after the last
// one is done (see entryUse.release).
//
// A Backend that takes the same lock again and again usually finds the
// same entries ahead of its own (entry names are reused, see keys.go, and
// a queue of steady contenders keeps its order), so its next wait finds
// their watches open: no watch is created or cancelled, and since such a
// watch predates the read that found the entry, it reports any deletion
// after that read without the one more read a new watch may need (see
// state). A watch not in use is cancelled after entryWatchLinger, or when
// more than maxIdleWatches are idle; nothing reads it meanwhile (the etcd
// client keeps what it reports, and the next waiter to use it reads that
// first). A deletion thus wakes the waiters that watch the entry, and is
// sent to a Backend that watched it up to entryWatchLinger before.
//
// The waiters using a watch read its channel themselves (no goroutine
// per watch besides the etcd client's own); whichever receives a
// response updates the watch's state and wakes the others.

// maxIdleWatches bounds the entry watches no waiter uses per Backend.
const maxIdleWatches = 16

// waitWatches is the entry watches of the Backend's waiters. Guarded by
// Backend.mu.
type waitWatches struct {
	entries  map[string]*entryWatch // by etcd key
	idle     int                    // entries no waiter uses
	reaper   *time.Timer            // runs reapEntries
	anchored bool                   // anchorLoop runs
}

// entryWatch is the Backend's watch for deletions of one etcd key.
// Guarded by Backend.mu.
type entryWatch struct {
	key     string
	cancel  context.CancelFunc
	ch      clientv3.WatchChan // set once created
	from    int64              // the watch reports the deletions after this revision (0: not created yet)
	deleted int64              // the latest revision of a deletion reported
	ended   bool               // the watch ended (cancelled, failed): create another
	changed chan struct{}      // closed (and replaced) on every change above
	users   int                // waiters using it
	idle    time.Time          // when users dropped to 0
}

// entryUse is one waiter's use of an entry watch for the deletion of kv,
// an entry seen at revision readRev.
type entryUse struct {
	w        *entryWatch
	kv       *mvccpb.KeyValue
	readRev  int64
	verify   bool // read kv once more if the watch may have started after a deletion
	verified bool
}

// watchEntry returns a use of the entry watch for kv, seen at readRev,
// creating the watch if the Backend has none open. With verify, a
// deletion between readRev and the start of a newer watch is found by one
// more read (see state); without, it goes unnoticed, which is fine for
// the entry before the predecessor, watched only to save a read later.
func (b *Backend) watchEntry(kv *mvccpb.KeyValue, readRev int64, verify bool) *entryUse {
	key := string(kv.Key)
	b.mu.Lock()
	defer b.mu.Unlock()
	share := b.tune.shareWatches
	w := b.waits.entries[key] // never an ended one
	if w == nil || !share {
		w = &entryWatch{key: key, changed: make(chan struct{})}
		if b.closed {
			w.ended = true
		} else {
			ctx, cancel := context.WithCancel(b.waitCtx)
			w.cancel = cancel
			if share {
				b.waits.entries[key] = w
			}
			b.wg.Add(1)
			go b.createEntry(ctx, w)
		}
	} else if w.users == 0 {
		b.waits.idle--
	}
	w.users++
	return &entryUse{w: w, kv: kv, readRev: readRev, verify: verify}
}

// createEntry creates the entry watch w: it returns once the server
// confirmed the watch (or the watch ended), which it tells w's users.
func (b *Backend) createEntry(ctx context.Context, w *entryWatch) {
	defer b.wg.Done()
	ch := b.cli.Watch(ctx, w.key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	resp, ok := <-ch
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok && resp.Created && !resp.Canceled && resp.Err() == nil {
		w.ch, w.from = ch, max(resp.Header.Revision, 1)
	} else {
		b.endEntryLocked(w)
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// consume records the receive (resp, ok) on w's channel by one of its
// users and wakes the others.
func (b *Backend) consume(w *entryWatch, resp clientv3.WatchResponse, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !ok || resp.Canceled || resp.Err() != nil {
		// Cancelled by the server (compacted past its revision, no
		// leader), the client closing: a new watch will be needed.
		b.endEntryLocked(w)
	}
	for _, ev := range resp.Events {
		if ev.Type == mvccpb.DELETE && ev.Kv.ModRevision > w.deleted {
			w.deleted = ev.Kv.ModRevision
		}
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// endEntryLocked marks w ended, cancels it and forgets it. b.mu must be
// held.
func (b *Backend) endEntryLocked(w *entryWatch) {
	if w.ended {
		return
	}
	w.ended = true
	if w.cancel != nil {
		w.cancel()
	}
	if b.waits.entries[w.key] == w {
		delete(b.waits.entries, w.key)
		if w.users == 0 {
			b.waits.idle--
		}
	}
}

// release ends the use u; a nil u is ignored.
func (u *entryUse) release(b *Backend) {
	if u == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := u.w
	if w.users--; w.users > 0 || w.ended {
		return
	}
	if b.waits.entries[w.key] != w {
		b.endEntryLocked(w) // not shared (shareWatches off)
		return
	}
	w.idle = time.Now()
	b.waits.idle++
	if b.closed {
		b.endEntryLocked(w)
		return
	}
	if b.waits.idle > maxIdleWatches {
		var oldest *entryWatch
		for _, x := range b.waits.entries {
			if x.users == 0 && (oldest == nil || x.idle.Before(oldest.idle)) {
				oldest = x
			}
		}
		b.endEntryLocked(oldest)
	}
	if b.waits.reaper == nil {
		b.waits.reaper = time.AfterFunc(b.tune.entryWatchLinger, b.reapEntries)
	}
}

// reapEntries cancels the entry watches idle for entryWatchLinger, and
// runs again later while some are idle.
func (b *Backend) reapEntries() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waits.reaper = nil
	if b.closed {
		return
	}
	var next time.Duration
	for _, w := range b.waits.entries {
		if w.users > 0 {
			continue
		}
		if d := b.tune.entryWatchLinger - time.Since(w.idle); d > 0 {
			if next == 0 || d < next {
				next = d
			}
			continue
		}
		b.endEntryLocked(w)
	}
	if next > 0 {
		b.waits.reaper = time.AfterFunc(next, b.reapEntries)
	}
}

// state reports what u's watch tells: the revision of a deletion of u's
// entry after u.readRev (at which the entry existed, so that is the
// deletion of the incarnation seen); 0 if none was reported (yet), with
// what to wait on: a channel closed on the watch's next change, and the
// watch's channel (nil until created), whose receives go to consume; -1
// if the watch ended (the caller reads again).
//
// A watch that started after u.readRev (created for this use) may have
// missed a deletion in between: if u.verify, the entry is read once,
// when the watch's start revision is known.
func (u *entryUse) state(ctx context.Context, wt *waiter) (int64, <-chan struct{}, clientv3.WatchChan, error) {
	b := wt.b
	b.mu.Lock()
	w := u.w
	deleted, ended, from, changed, ch := w.deleted, w.ended, w.from, w.changed, w.ch
	b.mu.Unlock()
	switch {
	case deleted > u.readRev:
		return deleted, nil, nil, nil
	case ended:
		if err := ctx.Err(); err != nil {
			return 0, nil, nil, err
		}
		if b.ctx.Err() != nil {
			return 0, nil, nil, errClosed
		}
		return -1, nil, nil, nil
	case from == 0:
		return 0, changed, nil, nil // not created yet
	case u.verify && !u.verified && from > u.readRev:
		// Written to since the read: the entry may be gone already. A
		// serializable read (no round of consensus) will do if it
		// reflects the watch's start; otherwise (a lagging member) it is
		// repeated linearizably.
		u.verified = true
		key := string(u.kv.Key)
		g, err := b.cli.Get(ctx, key, clientv3.WithKeysOnly(), clientv3.WithSerializable())
		if err == nil && g.Header.Revision < from {
			g, err = b.cli.Get(ctx, key, clientv3.WithKeysOnly())
		}
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return 0, nil, nil, ctxErr
			}
			return 0, nil, nil, wt.errAcquire(err)
		}
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != u.kv.CreateRevision {
			return g.Header.Revision, nil, nil, nil
		}
	}
	return 0, changed, ch, nil
}
