package dlock

import (
	"context"
	"errors"
	"fmt"
)

// Kind is what a hold grants on its key.
type Kind uint8

const (
	// KindLock is an exclusive hold: a lock, or a read-write lock's write
	// hold. It is the zero value.
	KindLock Kind = iota
	// KindPermit is one of a semaphore's Request.Permits permits: at most
	// that many holds of the key at once.
	KindPermit
	// KindRead is a read-write lock's shared hold: any number at once,
	// none while a KindLock hold is held, and no new one while a writer
	// waits (Request.Waiting), so writers are not starved.
	KindRead
)

// String returns "lock", "permit" or "read".
func (k Kind) String() string {
	switch k {
	case KindLock:
		return "lock"
	case KindPermit:
		return "permit"
	case KindRead:
		return "read"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// KindSupporter is an optional Backend capability: the hold kinds other
// than KindLock it implements. The Client sends a request of another kind
// only to a backend that reports it; such a backend honours Request.Kind,
// Permits and Waiting in every method that takes a Request.
type KindSupporter interface {
	SupportsKind(k Kind) bool
}

// ErrPermits reports a semaphore acquisition whose number of permits
// disagrees with the number the key's current holders use. Nothing is
// changed.
var ErrPermits = errors.New("dlock: semaphore permits disagree")

// A Semaphore hands out at most a fixed number of permits on one key at
// once, across every Client of the backend. Each permit is a Lease: it is
// renewed by the watchdog, reports its loss, carries its own fence, and a
// dead holder's permit returns when its TTL runs out. Create it with
// Client.Semaphore.
type Semaphore struct {
	c       *Client
	key     string
	permits int
}

// Semaphore returns the semaphore of permits permits on key. Every holder
// of the key must use the same number: an acquisition that disagrees
// with the current holders fails with ErrPermits. A permits below 1 is an
// ErrInvalidOption error at Acquire.
func (c *Client) Semaphore(key string, permits int) *Semaphore {
	return &Semaphore{c: c, key: key, permits: permits}
}

// Acquire takes a permit, waiting as the wait strategy allows while all
// are held (by notification, or in arrival order with WithFIFO). It
// returns like Client.Acquire. WithOwner is an ErrInvalidOption error:
// permits are not reentrant.
func (s *Semaphore) Acquire(ctx context.Context, opts ...Option) (*Lease, error) {
	return s.c.acquireKind(ctx, s.key, KindPermit, s.permits, opts, false)
}

// TryAcquire makes exactly one attempt to take a permit, as
// Client.TryAcquire.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...Option) (*Lease, error) {
	return s.c.acquireKind(ctx, s.key, KindPermit, s.permits, opts, true)
}

// An RWLock is a read-write lock on one key: any number of read holds at
// once, or one write hold. A waiting writer keeps new readers out, so a
// stream of readers cannot starve it; readers that already hold go on.
// Every hold is a Lease with its own fence, and a write hold's fence is
// above every fence issued for the key before it, readers' included. The
// write hold is the key's ordinary lock: Client.Acquire of the key
// excludes readers too. Create it with Client.RWLock.
type RWLock struct {
	c   *Client
	key string
}

// RWLock returns the read-write lock on key.
func (c *Client) RWLock(key string) *RWLock { return &RWLock{c: c, key: key} }

// RLock takes a read hold, waiting as the wait strategy allows while a
// writer holds the key or waits for it. It returns like Client.Acquire.
// WithOwner is an ErrInvalidOption error: read holds are not reentrant.
func (rw *RWLock) RLock(ctx context.Context, opts ...Option) (*Lease, error) {
	return rw.c.acquireKind(ctx, rw.key, KindRead, 0, opts, false)
}

// TryRLock makes exactly one attempt to take a read hold.
func (rw *RWLock) TryRLock(ctx context.Context, opts ...Option) (*Lease, error) {
	return rw.c.acquireKind(ctx, rw.key, KindRead, 0, opts, true)
}

// Lock takes the write hold, waiting as the wait strategy allows; while
// it waits, no new reader enters. It returns like Client.Acquire.
func (rw *RWLock) Lock(ctx context.Context, opts ...Option) (*Lease, error) {
	return rw.c.acquireKind(ctx, rw.key, KindLock, 0, opts, false)
}

// TryLock makes exactly one attempt to take the write hold.
func (rw *RWLock) TryLock(ctx context.Context, opts ...Option) (*Lease, error) {
	return rw.c.acquireKind(ctx, rw.key, KindLock, 0, opts, true)
}

// checkKind validates a request of kind k for this Client's backend.
func (c *Client) checkKind(k Kind, permits int, cfg *config) error {
	if k == KindLock {
		return nil
	}
	if ks, ok := c.b.(KindSupporter); !ok || !ks.SupportsKind(k) {
		return fmt.Errorf("dlock: backend %T has no %s holds: %w", c.b, k, errors.ErrUnsupported)
	}
	if cfg.owner != "" {
		return fmt.Errorf("%w: WithOwner: %s holds are not reentrant", ErrInvalidOption, k)
	}
	if k == KindPermit && permits < 1 {
		return fmt.Errorf("%w: a semaphore needs at least 1 permit, got %d", ErrInvalidOption, permits)
	}
	return nil
}
