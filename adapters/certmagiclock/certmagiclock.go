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
// Leases are renewed by the Client's watchdog while certmagic works (and
// also when certmagic asks through RenewLockLease), and a lease that is
// lost is not renewed behind certmagic's back: Unlock then reports it.
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
)

// KeyPrefix starts the dlock key of every certmagic lock.
const KeyPrefix = "certmagic:"

// releaseTimeout bounds an Unlock whose context is already done.
const releaseTimeout = 5 * time.Second

// Locker is a certmagic.Locker (and TryLocker, LockLeaseRenewer) on a
// dlock Client. Create it with New. It is safe for concurrent use; one
// Locker serves every certificate of an instance.
type Locker struct {
	c    *dlock.Client
	opts []dlock.Option

	mu   sync.Mutex
	held map[string]*dlock.Lease // by certmagic lock name
}

var (
	_ certmagic.Locker           = (*Locker)(nil)
	_ certmagic.TryLocker        = (*Locker)(nil)
	_ certmagic.LockLeaseRenewer = (*Locker)(nil)
)

// New returns a Locker taking locks on c, with opts applied to every
// acquisition.
func New(c *dlock.Client, opts ...dlock.Option) *Locker {
	return &Locker{c: c, opts: opts, held: make(map[string]*dlock.Lease)}
}

// Lock takes the lock name, waiting (per the Client's wait strategy) while
// another instance, or another goroutine of this one, holds it. It
// returns nil once held, or the Client's error (matching
// dlock.ErrNotAcquired and ctx's error when ctx ended the wait).
func (l *Locker) Lock(ctx context.Context, name string) error {
	lease, err := l.c.Acquire(ctx, KeyPrefix+name, l.opts...)
	if err != nil {
		return err
	}
	l.keep(name, lease)
	return nil
}

// TryLock makes one attempt to take the lock name: true when taken, false
// (and a nil error) when someone else holds it.
func (l *Locker) TryLock(ctx context.Context, name string) (bool, error) {
	lease, err := l.c.TryAcquire(ctx, KeyPrefix+name, l.opts...)
	if errors.Is(err, dlock.ErrNotAcquired) && ctx.Err() == nil {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	l.keep(name, lease)
	return true, nil
}

func (l *Locker) keep(name string, lease *dlock.Lease) {
	l.mu.Lock()
	l.held[name] = lease
	l.mu.Unlock()
}

// Unlock releases the lock name. It returns an error matching
// dlock.ErrNotHeld when this instance does not hold it, and one matching
// dlock.ErrLost when the lease was lost while held (another instance may
// have taken the lock meanwhile). A done ctx is replaced by a fresh one
// bounded by 5s.
func (l *Locker) Unlock(ctx context.Context, name string) error {
	l.mu.Lock()
	lease := l.held[name]
	delete(l.held, name)
	l.mu.Unlock()
	if lease == nil {
		return fmt.Errorf("certmagiclock: unlock %q: %w", name, dlock.ErrNotHeld)
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
	}
	return lease.Release(ctx)
}

// RenewLockLease extends the lock name to at least d from now (never
// shortening it). It returns an error matching dlock.ErrNotHeld when this
// instance does not hold it.
func (l *Locker) RenewLockLease(ctx context.Context, name string, d time.Duration) error {
	l.mu.Lock()
	lease := l.held[name]
	l.mu.Unlock()
	if lease == nil {
		return fmt.Errorf("certmagiclock: renew %q: %w", name, dlock.ErrNotHeld)
	}
	return lease.Refresh(ctx, max(d, lease.TTL()))
}

// Fence returns the fencing token of the lock this instance holds on
// name, or 0 when it holds none.
func (l *Locker) Fence(name string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lease := l.held[name]; lease != nil && lease.Err() == nil {
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
