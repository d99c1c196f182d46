// Package gooselock is a goose v3 lock.Locker on any dlock backend (it
// takes a *dlock.Client): migrators of the same database, in any number
// of processes, never run migrations at once.
//
//	locks := dlock.New(backend, dlock.WithTTL(30*time.Second))
//	p, _ := goose.NewProvider(goose.DialectPostgres, db, migrations,
//		goose.WithLocker(gooselock.New(locks, "goose:app")))
//
// goose's own Postgres lockers use a session advisory lock or a lock
// table row; the first does not survive transaction pooling (PgBouncer),
// and both keep the lock in the database being migrated. With gooselock
// the lock lives wherever the dlock backend keeps it (pglock keeps it in
// a lease table that works through transaction pooling), is renewed by
// the Client's watchdog while migrations run, and is freed by its TTL if
// the migrating process dies.
//
// Lock waits while another migrator holds the lock, as the Client's wait
// strategy allows: by default until goose's context ends, and goose's
// Up usually runs with one that never does. To give up after a while,
// as goose's own lockers do (after 5 minutes), pass
// dlock.WithWait(dlock.Limit(...)) to New, or bound the context given to
// goose.
//
// # Fences
//
// goose passes neither the lock nor its context to migrations. Fence
// returns the fencing token of the lock while held, for migration code
// that has the Locker at hand.
package gooselock

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/pressly/goose/v3/lock"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/release"
)

// releaseTimeout bounds an Unlock (see Locker.Unlock).
const releaseTimeout = 5 * time.Second

// Locker is a goose lock.Locker on a dlock Client. Create it with New;
// give each goose Provider its own.
type Locker struct {
	c    *dlock.Client
	key  string
	opts []dlock.Option

	mu    sync.Mutex
	lease *dlock.Lease // while held
}

var _ lock.Locker = (*Locker)(nil)

// New returns a Locker taking the lock key on c, with opts applied to the
// acquisition. Use one key per migrated database, the same in every
// process that migrates it.
func New(c *dlock.Client, key string, opts ...dlock.Option) *Locker {
	return &Locker{c: c, key: key, opts: opts}
}

// Lock takes the lock, waiting (per the Client's wait strategy) while
// another migrator holds it. db is not used: the lock lives in the dlock
// backend. It returns nil once held, or the Client's error (matching
// dlock.ErrNotAcquired and ctx's error when ctx ended the wait).
func (l *Locker) Lock(ctx context.Context, _ *sql.DB) error {
	lease, err := l.c.Acquire(ctx, l.key, l.opts...)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.lease = lease
	l.mu.Unlock()
	return nil
}

// Unlock releases the lock. It returns an error matching dlock.ErrNotHeld
// when the Locker does not hold it, and one matching dlock.ErrLost when
// the lease was lost while migrations ran (another migrator may have
// started meanwhile). The release is bounded by 5s as well as by ctx's
// deadline; without one, or when ctx has ended, it runs without ctx's
// cancellation (goose unlocks with a context that never ends).
func (l *Locker) Unlock(ctx context.Context, _ *sql.DB) error {
	l.mu.Lock()
	lease := l.lease
	l.lease = nil
	l.mu.Unlock()
	if lease == nil {
		return fmt.Errorf("gooselock: unlock %q: %w", l.key, dlock.ErrNotHeld)
	}
	rctx, cancel := release.Context(ctx, releaseTimeout)
	defer cancel()
	return lease.Release(rctx)
}

// Fence returns the fencing token of the lock while this Locker holds it,
// or 0.
func (l *Locker) Fence() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lease == nil || l.lease.Err() != nil {
		return 0
	}
	return l.lease.Fence()
}
