// Package certmagiclock makes certmagic's storage locks dlock locks, on
// any dlock backend (it takes a *dlock.Client): instances sharing a
// certificate storage then never obtain, renew or revoke the same
// certificate at once, whatever the storage itself offers for locking.
//
//	locks := dlock.New(backend, dlock.WithTTL(30*time.Second))
//	cfg := certmagic.New(cache, certmagic.Config{
//		Storage: certmagiclock.Wrap(&certmagic.FileStorage{Path: dir}, certmagiclock.New(locks)),
//	})
//
// certmagic names its locks after the operation and the certificate
// ("issue_cert_example.com"); the dlock key is KeyPrefix + that name.
// Leases are renewed by the Client's watchdog while certmagic works.
// certmagic asks, before each attempt of an operation it retries, to
// renew the lease (RenewLockLease): the Locker renews it to the Client's
// TTL, and takes a lost lock again if it is free, after which certmagic
// checks its storage before it goes on. A loss is not hidden from
// certmagic: the renewal fails when the lock cannot be taken again, and
// Unlock reports it. Within one instance a name is held by one goroutine
// at a time, from Lock to Unlock, as certmagic's Locker asks.
//
// # Fences
//
// certmagic's Locker documentation asks for fencing tokens, but it does
// not pass them to its storage writes. Locker.Fence returns the fence of
// the lock this instance holds on a name, for a storage implementation
// that can check it on its writes (a database storage can compare it with
// a fence column, see package fence).
package certmagiclock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/release"
)

// KeyPrefix starts the dlock key of every certmagic lock.
const KeyPrefix = "certmagic:"

// releaseTimeout bounds an Unlock (see Locker.Unlock).
const releaseTimeout = 5 * time.Second

// Locker is a certmagic.Locker (and TryLocker, LockLeaseRenewer) on a
// dlock Client. Create it with New. It is safe for concurrent use; one
// Locker serves every certificate of an instance.
type Locker struct {
	c    *dlock.Client
	opts []dlock.Option

	mu    sync.Mutex
	names map[string]*hold // by certmagic lock name, while held or waited for
}

// hold is this instance's side of one lock name: certmagic holds the name
// from a Lock to its Unlock, whatever becomes of the lease meanwhile, so
// the name is taken in the process (turn) as well as on the server.
type hold struct {
	turn  chan struct{} // buffer one: full while a goroutine holds the name
	lease *dlock.Lease  // while held: the current lease; guarded by Locker.mu
	refs  int           // goroutines holding or waiting for the name
}

var (
	_ certmagic.Locker           = (*Locker)(nil)
	_ certmagic.TryLocker        = (*Locker)(nil)
	_ certmagic.LockLeaseRenewer = (*Locker)(nil)
)

// New returns a Locker taking locks on c, with opts applied to every
// acquisition.
func New(c *dlock.Client, opts ...dlock.Option) *Locker {
	return &Locker{c: c, opts: opts, names: make(map[string]*hold)}
}

// Lock takes the lock name, waiting (per the Client's wait strategy) while
// another instance, or another goroutine of this one, holds it. It
// returns nil once held, or the Client's error (matching
// dlock.ErrNotAcquired and ctx's error when ctx ended the wait).
func (l *Locker) Lock(ctx context.Context, name string) error {
	return l.take(ctx, name, false)
}

// TryLock makes one attempt to take the lock name: true when taken, false
// (and a nil error) when someone else holds it.
func (l *Locker) TryLock(ctx context.Context, name string) (bool, error) {
	err := l.take(ctx, name, true)
	if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
		return false, nil
	}
	return err == nil, err
}

// take takes name's turn in the process, then the lock on the server: one
// attempt each when try is set (an error matching dlock.ErrNotAcquired
// when either is taken), else waiting for both.
func (l *Locker) take(ctx context.Context, name string, try bool) error {
	if err := l.check("lock", name); err != nil {
		return err
	}
	h := l.ref(name)
	if err := awaitTurn(ctx, h, try); err != nil {
		l.unref(name, h)
		return fmt.Errorf("certmagiclock: lock %q: %w: %w", name, dlock.ErrNotAcquired, err)
	}
	acquire := l.c.Acquire
	if try {
		acquire = l.c.TryAcquire
	}
	lease, err := acquire(ctx, KeyPrefix+name, l.opts...)
	if err != nil {
		<-h.turn
		l.unref(name, h)
		return err
	}
	l.mu.Lock()
	h.lease = lease
	l.mu.Unlock()
	return nil
}

// awaitTurn takes h's turn in the process: at once or not at all when try
// is set, else waiting until ctx ends.
func awaitTurn(ctx context.Context, h *hold, try bool) error {
	if try {
		select {
		case h.turn <- struct{}{}:
			return nil
		default:
			return errors.New("another goroutine of this instance holds it")
		}
	}
	select {
	case h.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// check returns an error when l has no Client (a nil Locker, or New(nil)).
func (l *Locker) check(op, name string) error {
	if l == nil || l.c == nil {
		return fmt.Errorf("certmagiclock: %s %q: %w: no dlock Client (a nil Locker, or New(nil))", op, name, dlock.ErrInvalidOption)
	}
	return nil
}

// ref returns name's hold, counting the caller in.
func (l *Locker) ref(name string) *hold {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.names[name]
	if h == nil {
		h = &hold{turn: make(chan struct{}, 1)}
		l.names[name] = h
	}
	h.refs++
	return h
}

// unref counts the caller out of name's hold h, forgetting it after the
// last.
func (l *Locker) unref(name string, h *hold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.refs--; h.refs == 0 {
		delete(l.names, name)
	}
}

// held returns name's hold and lease while this instance holds it.
func (l *Locker) held(name string) (*hold, *dlock.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.names[name]; h != nil && h.lease != nil {
		return h, h.lease
	}
	return nil, nil
}

// Unlock releases the lock name. It returns an error matching
// dlock.ErrNotHeld when this instance does not hold it, and one matching
// dlock.ErrLost when the lease was lost while held (another instance may
// have taken the lock meanwhile). The release is bounded by 5s as well as
// by ctx's deadline; without one, or when ctx has ended, it runs without
// ctx's cancellation (certmagic unlocks with a context that never ends).
func (l *Locker) Unlock(ctx context.Context, name string) error {
	if err := l.check("unlock", name); err != nil {
		return err
	}
	l.mu.Lock()
	h := l.names[name]
	var lease *dlock.Lease
	if h != nil {
		lease, h.lease = h.lease, nil
	}
	l.mu.Unlock()
	if lease == nil {
		return fmt.Errorf("certmagiclock: unlock %q: %w", name, dlock.ErrNotHeld)
	}
	rctx, cancel := release.Context(ctx, releaseTimeout)
	defer cancel()
	err := lease.Release(rctx)
	<-h.turn
	l.unref(name, h)
	return err
}

// RenewLockLease reports whether this instance still holds the lock name
// on the server: it renews the lease (to the Client's TTL: the watchdog
// keeps it while the process lives, and a longer one would keep the name
// from other instances long after a crash) and, when the lease was lost,
// takes the lock again if it is free. It returns an error matching
// dlock.ErrNotHeld when this instance does not hold the name, and the
// loss or the attempt's error when the lock could not be kept; certmagic
// checks its storage again after a successful renewal. d is not used.
func (l *Locker) RenewLockLease(ctx context.Context, name string, d time.Duration) error {
	if err := l.check("renew", name); err != nil {
		return err
	}
	h, lease := l.held(name)
	if lease == nil {
		return fmt.Errorf("certmagiclock: renew %q: %w", name, dlock.ErrNotHeld)
	}
	err := lease.Refresh(ctx, 0)
	if err == nil || !errors.Is(lease.Err(), dlock.ErrLost) {
		return err
	}
	again, aerr := l.c.TryAcquire(ctx, KeyPrefix+name, l.opts...)
	if aerr != nil {
		return fmt.Errorf("certmagiclock: renew %q: %w (and taking it again: %w)", name, err, aerr)
	}
	l.mu.Lock()
	kept := h.lease == lease // else Unlocked meanwhile: not ours to keep
	if kept {
		h.lease = again
	}
	l.mu.Unlock()
	if !kept {
		rctx, cancel := release.Context(ctx, releaseTimeout)
		defer cancel()
		_ = again.Release(rctx)
		return fmt.Errorf("certmagiclock: renew %q: %w", name, dlock.ErrNotHeld)
	}
	return nil
}

// Fence returns the fencing token of the lock this instance holds on
// name, or 0 when it holds none.
func (l *Locker) Fence(name string) uint64 {
	if l == nil {
		return 0
	}
	if _, lease := l.held(name); lease != nil && lease.Err() == nil {
		return lease.Fence()
	}
	return 0
}

// Storage is a certmagic.Storage whose locking methods are a Locker's.
// Create it with Wrap.
type Storage struct {
	certmagic.Storage
	locker *Locker
}

var (
	_ certmagic.Storage          = (*Storage)(nil)
	_ certmagic.TryLocker        = (*Storage)(nil)
	_ certmagic.LockLeaseRenewer = (*Storage)(nil)
)

// Wrap returns s with its Lock and Unlock replaced by l's; every other
// method is s's.
func Wrap(s certmagic.Storage, l *Locker) *Storage { return &Storage{Storage: s, locker: l} }

// Lock is Locker.Lock.
func (s *Storage) Lock(ctx context.Context, name string) error { return s.locker.Lock(ctx, name) }

// TryLock is Locker.TryLock.
func (s *Storage) TryLock(ctx context.Context, name string) (bool, error) {
	return s.locker.TryLock(ctx, name)
}

// Unlock is Locker.Unlock.
func (s *Storage) Unlock(ctx context.Context, name string) error { return s.locker.Unlock(ctx, name) }

// RenewLockLease is Locker.RenewLockLease.
func (s *Storage) RenewLockLease(ctx context.Context, name string, d time.Duration) error {
	return s.locker.RenewLockLease(ctx, name, d)
}

// Locker returns the Locker behind the storage's locks (for Fence).
func (s *Storage) Locker() *Locker { return s.locker }
