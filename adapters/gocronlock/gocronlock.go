// Package gocronlock runs gocron v2 jobs under dlock locks: a Locker that
// lets one scheduler instance run each tick of a job, and an Elector that
// lets one instance (the leader) run every job. Both work on any dlock
// backend: they take a *dlock.Client.
//
//	locks := dlock.New(backend, dlock.WithTTL(30*time.Second))
//	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(
//		gocronlock.NewLocker(locks, dlock.WithMinHold(time.Second))))
//
// # One run per tick
//
// gocron asks the Locker for the job's name before each run and skips the
// run when Lock fails; it calls Unlock when the run ends. A job that ends
// quickly would release the lock before an instance whose clock (or
// timer) lags by a few milliseconds fires the same tick, and the job would
// run twice. Give the Locker a minimum hold (dlock.WithMinHold) longer
// than the largest offset between the instances' ticks and shorter than
// the job's interval: the lock then stays taken until every instance has
// passed that tick, whatever the job's duration. Locks are taken with
// TryAcquire: an instance never waits for another's run.
//
// # Job names
//
// The lock of a job is KeyPrefix + its gocron name, the same on every
// instance, and gocron's default name is the Go function's name
// ("main.main.func1"). Name every job (gocron.WithName) so that the name
// is unique across all applications whose schedulers share the backend:
// two jobs with one name exclude each other, and one of them skips its
// runs.
//
// # A run that outlives its lock
//
// gocron discards the error of Unlock, which reports a lease lost while
// the job ran (the job outlived its lock, and another instance may have
// run the same tick). Pass dlock.WithOnLost to NewLocker to hear of it.
//
// # Fences
//
// gocron does not pass the Lock to the job. The Lock's Fence and the
// Elector's Fence (the leadership term, strictly increasing) are there for
// code that has the value: a job defined with access to the Elector can
// fence its writes with Elector.Fence.
package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/release"
)

// KeyPrefix starts the dlock key of every job lock ("gocron:" + job name).
const KeyPrefix = "gocron:"

// releaseTimeout bounds an Unlock or Resign (gocron unlocks with the job's
// context, cancelled at shutdown).
const releaseTimeout = 5 * time.Second

// Locker is a gocron.Locker on a dlock Client. Create it with NewLocker.
type Locker struct {
	c    *dlock.Client
	opts []dlock.Option
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker taking the lock KeyPrefix+jobName on c for
// each run, with opts applied to every acquisition (typically
// dlock.WithMinHold; see the package documentation).
func NewLocker(c *dlock.Client, opts ...dlock.Option) *Locker {
	return &Locker{c: c, opts: opts}
}

// Lock makes one attempt to take the job's lock. It returns the held Lock,
// or an error (matching dlock.ErrNotAcquired when another instance holds
// it), on which gocron skips this run.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	lease, err := l.c.TryAcquire(ctx, KeyPrefix+key, l.opts...)
	if err != nil {
		return nil, err
	}
	return &Lock{lease: lease}, nil
}

// Lock is one run's hold of a job's lock.
type Lock struct{ lease *dlock.Lease }

// Unlock releases the lock (with a minimum hold, the server keeps it until
// the hold has passed). The release is bounded by 5s as well as by ctx's
// deadline; without one, or when ctx has ended, it runs without ctx's
// cancellation, so a run that ends at shutdown still gives its lock back.
func (l *Lock) Unlock(ctx context.Context) error {
	rctx, cancel := release.Context(ctx, releaseTimeout)
	defer cancel()
	err := l.lease.Release(rctx)
	if errors.Is(err, dlock.ErrLost) {
		return fmt.Errorf("gocronlock: the job ran past its lock: %w", err)
	}
	return err
}

// Fence returns the lock's fencing token.
func (l *Lock) Fence() uint64 { return l.lease.Fence() }

// Lease returns the lease behind the lock.
func (l *Lock) Lease() *dlock.Lease { return l.lease }

// ErrNotLeader is returned by Elector.IsLeader on instances that do not
// hold the leadership.
var ErrNotLeader = errors.New("dlock: gocronlock: not the leader")

// Elector is a gocron.Elector on a dlock Client: the instance that holds
// the lock key is the leader, until it resigns, closes its Client or loses
// the lease. Create it with NewElector.
type Elector struct {
	c    *dlock.Client
	key  string
	opts []dlock.Option

	mu    sync.Mutex
	lease *dlock.Lease // the leadership, while held
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector returns an Elector campaigning for the lock key on c, with
// opts applied to the acquisition. The lease is auto-renewed (unless opts
// say otherwise) for as long as the instance leads.
func NewElector(c *dlock.Client, key string, opts ...dlock.Option) *Elector {
	return &Elector{c: c, key: key, opts: opts}
}

// IsLeader returns nil when this instance leads: it holds a live lease on
// the key, or it took the free lock now with one attempt. Otherwise it
// returns an error matching ErrNotLeader (and dlock.ErrNotAcquired), or
// the server's error.
func (e *Elector) IsLeader(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lease != nil && e.lease.Err() == nil && time.Now().Before(e.lease.Expires()) {
		return nil
	}
	e.lease = nil
	lease, err := e.c.TryAcquire(ctx, e.key, e.opts...)
	if errors.Is(err, dlock.ErrNotAcquired) {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	if err != nil {
		return err
	}
	e.lease = lease
	return nil
}

// Fence returns the current leadership term's fencing token, strictly
// greater than every earlier term's, or 0 when this instance does not
// lead.
func (e *Elector) Fence() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lease == nil || e.lease.Err() != nil {
		return 0
	}
	return e.lease.Fence()
}

// Resign gives up the leadership if this instance holds it; another
// instance can take it at its next IsLeader. The release is bounded as
// Lock.Unlock's.
func (e *Elector) Resign(ctx context.Context) error {
	e.mu.Lock()
	lease := e.lease
	e.lease = nil
	e.mu.Unlock()
	if lease == nil {
		return nil
	}
	rctx, cancel := release.Context(ctx, releaseTimeout)
	defer cancel()
	if err := lease.Release(rctx); err != nil && !errors.Is(err, dlock.ErrLost) && !errors.Is(err, dlock.ErrReleased) {
		return err
	}
	return nil
}
