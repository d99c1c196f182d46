// Package memlock is an in-process dlock backend: the same semantics as
// the server backends (TTL, owner tokens, fencing, reentrancy, release
// notifications, FIFO queue) for single-process programs, examples and
// tests. Locks live in a Store; every Backend of one Store sees the same
// locks, like several connections to one server.
//
// Fences come from one counter per Store, so they strictly increase per
// key (and across keys) for the life of the Store.
package memlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
)

// Store is an in-memory lock table shared by its Backends. The zero value
// is an empty Store, as NewStore returns.
type Store struct {
	mu     sync.Mutex
	locks  map[string]*entry
	shared map[string]*sharedState         // permit and read holds by key
	marks  map[string]map[string]time.Time // waiting writers' claims by key and token
	fence  uint64
	subs   map[string]map[chan struct{}]struct{}
	queues map[string][]*waiter
	paused chan struct{} // non-nil while paused; closed by Resume
}

type entry struct {
	token   string
	count   int
	fence   uint64
	expires time.Time
	value   string // an elected leader's value
}

// sharedState is a key's permit or read holds.
type sharedState struct {
	kind    dlock.Kind
	permits int
	holds   map[string]*entry // by token
}

type waiter struct {
	token string
	kind  dlock.Kind
	ready chan struct{} // closed when this waiter is at the head
}

// NewStore returns an empty Store.
func NewStore() *Store {
	s := &Store{}
	s.init()
	return s
}

// init makes s's tables, for a zero Store. s.mu must be held, or s not
// yet shared.
func (s *Store) init() {
	if s.locks != nil {
		return
	}
	s.locks = make(map[string]*entry)
	s.shared = make(map[string]*sharedState)
	s.marks = make(map[string]map[string]time.Time)
	s.subs = make(map[string]map[chan struct{}]struct{})
	s.queues = make(map[string][]*waiter)
}

// Pause makes the Store stop answering, like a frozen server: every call
// blocks until Resume or until its context ends (then it returns the
// context's error). Time keeps running, so leases expire meanwhile. For
// fault tests.
func (s *Store) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused == nil {
		s.paused = make(chan struct{})
	}
}

// Resume undoes Pause.
func (s *Store) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused != nil {
		close(s.paused)
		s.paused = nil
	}
}

// Backend returns a new connection to the Store.
func (s *Store) Backend() *Backend {
	s.mu.Lock()
	s.init()
	s.mu.Unlock()
	return &Backend{s: s}
}

// Backend is a dlock.Backend on a Store. Create it with New or
// Store.Backend. It implements dlock.Backend, dlock.BatchRefresher,
// dlock.Notifier, dlock.Waiter, dlock.Inspector, dlock.ForceReleaser and
// dlock.KindSupporter (semaphores and read-write locks) and
// dlock.Proclaimer (leader election).
type Backend struct {
	s      *Store
	mu     sync.Mutex
	closed bool
}

// New returns a Backend on a new, private Store.
func New() *Backend { return NewStore().Backend() }

// Store returns the Store the Backend is connected to.
func (b *Backend) Store() *Store { return b.s }

var errClosed = fmt.Errorf("memlock: %w", dlock.ErrClosed)

// enter waits while the store is paused and returns with s.mu held.
func (b *Backend) enter(ctx context.Context) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return errClosed
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.s.mu.Lock()
		p := b.s.paused
		if p == nil {
			return nil
		}
		b.s.mu.Unlock()
		select {
		case <-p:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// live returns the unexpired entry for key, deleting an expired one.
func (s *Store) live(key string, now time.Time) *entry {
	e := s.locks[key]
	if e != nil && !now.Before(e.expires) {
		delete(s.locks, key)
		s.promote(key)
		return nil
	}
	return e
}

// TryAcquire implements dlock.Backend.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := b.enter(ctx); err != nil {
		return dlock.Grant{}, err
	}
	defer b.s.mu.Unlock()
	return b.s.tryLocked(r, time.Now(), false)
}

// SetValue implements dlock.Proclaimer.
func (b *Backend) SetValue(ctx context.Context, r dlock.Request) error {
	if err := b.enter(ctx); err != nil {
		return err
	}
	defer b.s.mu.Unlock()
	e := b.s.live(r.Key, time.Now())
	if r.Kind != dlock.KindLock || !e.heldBy(r) {
		return dlock.ErrNotHeld
	}
	e.value = r.Value
	b.s.notify(r.Key)
	return nil
}

// SupportsKind implements dlock.KindSupporter: every kind.
func (b *Backend) SupportsKind(dlock.Kind) bool { return true }

var errKindMismatch = fmt.Errorf("memlock: %w", dlock.ErrWrongType)

// liveShared returns key's unexpired permit or read holds, pruning
// expired ones (a freed permit wakes the queue's head).
func (s *Store) liveShared(key string, now time.Time) *sharedState {
	sh := s.shared[key]
	if sh == nil {
		return nil
	}
	for tok, e := range sh.holds {
		if !now.Before(e.expires) {
			delete(sh.holds, tok)
			s.promote(key)
		}
	}
	if len(sh.holds) == 0 {
		delete(s.shared, key)
		return nil
	}
	return sh
}

// claimed reports the earliest end of another token's live writer claim
// on key, pruning expired claims.
func (s *Store) claimed(key, token string, now time.Time) (until time.Time, ok bool) {
	for tok, t := range s.marks[key] {
		switch {
		case !now.Before(t):
			delete(s.marks[key], tok)
		case tok != token && (!ok || t.Before(until)):
			until, ok = t, true
		}
	}
	if len(s.marks[key]) == 0 {
		delete(s.marks, key)
	}
	return until, ok
}

// claimFirst reports whether the writer r goes before the key's queue: it
// holds a live claim and only readers are queued, which its claim keeps
// out anyway (else the queue's head and the writer would wait for each
// other until the claim expired).
func (s *Store) claimFirst(r dlock.Request, now time.Time) bool {
	if t, ok := s.marks[r.Key][r.Token]; !ok || !now.Before(t) {
		return false
	}
	for _, w := range s.queues[r.Key] {
		if w.kind != dlock.KindRead {
			return false
		}
	}
	return true
}

func (s *Store) unclaim(key, token string) {
	if m := s.marks[key]; m != nil {
		delete(m, token)
		if len(m) == 0 {
			delete(s.marks, key)
			s.notify(key) // readers kept out may enter
		}
	}
}

// tryShared takes a permit or read hold of key if the kind's rule allows.
func (s *Store) tryShared(r dlock.Request, now time.Time, head bool) (dlock.Grant, error) {
	if e := s.live(r.Key, now); e != nil {
		if r.Kind == dlock.KindPermit {
			return dlock.Grant{}, fmt.Errorf("%w: %q is held as a lock, not a semaphore", errKindMismatch, r.Key)
		}
		return dlock.Grant{HolderTTL: e.expires.Sub(now)}, nil
	}
	sh := s.liveShared(r.Key, now)
	if sh != nil && sh.kind != r.Kind {
		return dlock.Grant{}, fmt.Errorf("%w: %q holds %s holds, not %s holds", errKindMismatch, r.Key, sh.kind, r.Kind)
	}
	if r.Kind == dlock.KindPermit && sh != nil {
		if sh.permits != r.Permits {
			return dlock.Grant{}, fmt.Errorf("memlock: %w: %q has %d permits, the request says %d", dlock.ErrPermits, r.Key, sh.permits, r.Permits)
		}
		if len(sh.holds) >= sh.permits {
			var first time.Time
			for _, e := range sh.holds {
				if first.IsZero() || e.expires.Before(first) {
					first = e.expires
				}
			}
			return dlock.Grant{HolderTTL: first.Sub(now)}, nil
		}
	}
	if r.Kind == dlock.KindRead {
		if until, ok := s.claimed(r.Key, r.Token, now); ok {
			return dlock.Grant{HolderTTL: until.Sub(now)}, nil
		}
	}
	if !head && len(s.queues[r.Key]) > 0 {
		return dlock.Grant{}, nil
	}
	if sh == nil {
		sh = &sharedState{kind: r.Kind, permits: r.Permits, holds: make(map[string]*entry)}
		s.shared[r.Key] = sh
	}
	if e := sh.holds[r.Token]; e != nil {
		return dlock.Grant{}, nil // a token holds one permit or read hold at a time
	}
	s.fence++
	sh.holds[r.Token] = &entry{token: r.Token, count: 1, fence: s.fence, expires: now.Add(r.TTL)}
	return dlock.Grant{OK: true, Fence: s.fence, Count: 1}, nil
}

// tryLocked takes the lock if it is free (and, unless head, nobody is
// queued) or re-entered.
func (s *Store) tryLocked(r dlock.Request, now time.Time, head bool) (dlock.Grant, error) {
	if r.Kind != dlock.KindLock {
		return s.tryShared(r, now, head)
	}
	e := s.live(r.Key, now)
	if e != nil {
		if r.Reentrant && e.token == r.Token {
			e.count++
			e.extend(now.Add(r.TTL))
			return dlock.Grant{OK: true, Fence: e.fence, Count: e.count}, nil
		}
		return dlock.Grant{HolderTTL: e.expires.Sub(now)}, nil
	}
	if sh := s.liveShared(r.Key, now); sh != nil {
		if sh.kind == dlock.KindPermit {
			return dlock.Grant{}, fmt.Errorf("%w: %q holds a semaphore's permits, not a lock", errKindMismatch, r.Key)
		}
		// Readers hold it: a writer that will retry keeps new ones out.
		var last time.Time
		for _, e := range sh.holds {
			last = later(last, e.expires)
		}
		if r.Waiting {
			if s.marks[r.Key] == nil {
				s.marks[r.Key] = make(map[string]time.Time)
			}
			s.marks[r.Key][r.Token] = now.Add(r.TTL)
		}
		return dlock.Grant{HolderTTL: last.Sub(now)}, nil
	}
	if !head && len(s.queues[r.Key]) > 0 && !s.claimFirst(r, now) {
		// Queued waiters go first; the holder's TTL is unknown (no holder).
		return dlock.Grant{}, nil
	}
	s.unclaim(r.Key, r.Token)
	s.fence++
	s.locks[r.Key] = &entry{token: r.Token, count: 1, fence: s.fence, expires: now.Add(r.TTL), value: r.Value}
	return dlock.Grant{OK: true, Fence: s.fence, Count: 1}, nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// holdOf returns the hold r came from: the key's lock, or r.Token's
// permit or read hold.
func (s *Store) holdOf(r dlock.Request, now time.Time) *entry {
	if r.Kind == dlock.KindLock {
		return s.live(r.Key, now)
	}
	if sh := s.liveShared(r.Key, now); sh != nil && sh.kind == r.Kind {
		return sh.holds[r.Token]
	}
	return nil
}

// Refresh implements dlock.Backend.
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	if err := b.enter(ctx); err != nil {
		return err
	}
	defer b.s.mu.Unlock()
	return b.s.refreshLocked(r, time.Now())
}

func (s *Store) refreshLocked(r dlock.Request, now time.Time) error {
	e := s.holdOf(r, now)
	if !e.heldBy(r) {
		return dlock.ErrNotHeld
	}
	e.extend(now.Add(r.TTL))
	return nil
}

// heldBy reports whether e is the grant r came from: its token, and its
// fence when r names one.
func (e *entry) heldBy(r dlock.Request) bool {
	return e != nil && e.token == r.Token && (r.Fence == 0 || r.Fence == e.fence)
}

// extend moves e's deadline to t unless it is later already: a deadline
// never moves back.
func (e *entry) extend(t time.Time) {
	if t.After(e.expires) {
		e.expires = t
	}
}

// RefreshMany implements dlock.BatchRefresher.
func (b *Backend) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	if err := b.enter(ctx); err != nil {
		return slices.Repeat([]error{err}, len(rs))
	}
	errs := make([]error, len(rs))
	defer b.s.mu.Unlock()
	now := time.Now()
	for i, r := range rs {
		errs[i] = b.s.refreshLocked(r, now)
	}
	return errs
}

// Release implements dlock.Backend. The last release of a lock notifies
// subscribers and wakes the head of the queue.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if err := b.enter(ctx); err != nil {
		return err
	}
	defer b.s.mu.Unlock()
	if r.Waiting && r.Fence == 0 && r.Kind == dlock.KindLock {
		// A writer that stopped waiting: withdraw its claim, never a
		// hold its token may have (an owner's, granted elsewhere).
		b.s.unclaim(r.Key, r.Token)
		return dlock.ErrNotHeld
	}
	now := time.Now()
	e := b.s.holdOf(r, now)
	if !e.heldBy(r) {
		return dlock.ErrNotHeld
	}
	if r.Kind != dlock.KindLock {
		sh := b.s.shared[r.Key]
		delete(sh.holds, r.Token)
		if len(sh.holds) == 0 {
			delete(b.s.shared, r.Key)
		}
		b.s.notify(r.Key)
		b.s.promote(r.Key)
		return nil
	}
	if e.count--; e.count > 0 {
		return nil
	}
	b.s.free(r.Key)
	return nil
}

// free deletes key's lock, notifies subscribers and wakes the queue's
// head. s.mu must be held.
func (s *Store) free(key string) {
	delete(s.locks, key)
	s.notify(key)
	s.promote(key)
}

// notify wakes key's subscribers. s.mu must be held.
func (s *Store) notify(key string) {
	for ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// promote tells the head of key's queue that it may take the lock.
func (s *Store) promote(key string) {
	if q := s.queues[key]; len(q) > 0 {
		select {
		case <-q[0].ready:
		default:
			close(q[0].ready)
		}
	}
}

// Subscribe implements dlock.Notifier.
func (b *Backend) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := b.enter(ctx); err != nil {
		return nil, nil, err
	}
	defer b.s.mu.Unlock()
	ch := make(chan struct{}, 1)
	m := b.s.subs[key]
	if m == nil {
		m = make(map[chan struct{}]struct{})
		b.s.subs[key] = m
	}
	m[ch] = struct{}{}
	return ch, func() {
		b.s.mu.Lock()
		defer b.s.mu.Unlock()
		delete(b.s.subs[key], ch)
		if len(b.s.subs[key]) == 0 {
			delete(b.s.subs, key)
		}
	}, nil
}

// Wait implements dlock.Waiter: with r.FIFO, waiters are served strictly
// in arrival order; without it, it returns errors.ErrUnsupported and the
// Client waits on notifications instead.
func (b *Backend) Wait(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if !r.FIFO {
		return dlock.Grant{}, errors.ErrUnsupported
	}
	if err := b.enter(ctx); err != nil {
		return dlock.Grant{}, err
	}
	if e := b.s.live(r.Key, time.Now()); e != nil && r.Kind == dlock.KindLock && r.Reentrant && e.token == r.Token {
		g, err := b.s.tryLocked(r, time.Now(), true)
		b.s.mu.Unlock()
		return g, err
	}
	w := &waiter{token: r.Token, kind: r.Kind, ready: make(chan struct{})}
	b.s.queues[r.Key] = append(b.s.queues[r.Key], w)
	b.s.mu.Unlock()

	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := b.enter(ctx); err != nil {
			b.s.mu.Lock()
			b.s.leave(r, w)
			b.s.mu.Unlock()
			return dlock.Grant{}, err
		}
		var expire <-chan time.Time
		if q := b.s.queues[r.Key]; q[0] == w {
			g, err := b.s.tryLocked(r, time.Now(), true)
			if err != nil {
				b.s.leave(r, w)
				b.s.mu.Unlock()
				return g, err
			}
			if g.OK {
				b.s.dequeue(r.Key, w)
				b.s.mu.Unlock()
				return g, nil
			}
			if g.HolderTTL <= 0 {
				g.HolderTTL = time.Millisecond
			}
			// Held: try again at the holder's expiry (expiry notifies nobody).
			if timer == nil {
				timer = time.NewTimer(g.HolderTTL)
			} else {
				timer.Reset(g.HolderTTL)
			}
			expire = timer.C
		}
		select {
		case <-w.ready:
			w.ready = make(chan struct{})
		default:
		}
		ready := w.ready
		b.s.mu.Unlock()

		select {
		case <-ctx.Done():
		case <-ready:
		case <-expire:
		}
	}
}

// leave takes the waiter w of r out of its queue and withdraws a writer's
// claim, so that the readers it kept out may enter. s.mu must be held.
func (s *Store) leave(r dlock.Request, w *waiter) {
	s.dequeue(r.Key, w)
	if r.Waiting {
		s.unclaim(r.Key, r.Token)
	}
}

// dequeue removes w from key's queue and wakes the new head, which
// either takes the lock or waits for the holder's expiry. s.mu must be
// held.
func (s *Store) dequeue(key string, w *waiter) {
	q := s.queues[key]
	for i, x := range q {
		if x == w {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(s.queues, key)
		if s.locks[key] == nil {
			// A free lock the queue kept from the others: tell them.
			s.notify(key)
		}
		return
	}
	s.queues[key] = q
	s.promote(key)
}

// Close closes this connection: later calls fail with dlock.ErrClosed.
// Locks it holds stay until released by another connection or expired.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

// QueueLen returns the number of FIFO waiters queued on key.
func (s *Store) QueueLen(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queues[key])
}

// Inspect implements dlock.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	if err := b.enter(ctx); err != nil {
		return dlock.Info{}, err
	}
	defer b.s.mu.Unlock()
	return b.s.infoLocked(key, time.Now()), nil
}

func (s *Store) infoLocked(key string, now time.Time) dlock.Info {
	info := dlock.Info{Key: key, Waiters: len(s.queues[key])}
	if e := s.live(key, now); e != nil {
		info.Held, info.Owner, info.Fence, info.TTL, info.Count, info.Value = true, e.token, e.fence, e.expires.Sub(now), e.count, e.value
	}
	if sh := s.liveShared(key, now); sh != nil {
		info.Held, info.Kind, info.Permits = true, sh.kind, sh.permits
		for _, e := range sh.holds {
			info.Holds = append(info.Holds, dlock.Hold{Owner: e.token, Fence: e.fence, TTL: e.expires.Sub(now)})
		}
	}
	return info
}

// ForceRelease implements dlock.ForceReleaser.
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	if err := b.enter(ctx); err != nil {
		return dlock.Info{}, err
	}
	defer b.s.mu.Unlock()
	info := b.s.infoLocked(key, time.Now())
	if info.Held {
		delete(b.s.shared, key)
		b.s.free(key)
	}
	return info, nil
}
