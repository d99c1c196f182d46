package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// leaseSet is the Backend's own etcd leases. Guarded by Backend.mu.
type leaseSet struct {
	shared map[int64]*leaseState // live shared leases by TTL in seconds
	spare  map[int64]*leaseState // private leases carrying nothing, by TTL in seconds
}

// leaseState is one etcd lease. A shared lease of the Backend carries
// all its non-reentrant locks (and queue entries) whose TTL rounds to the
// same number of seconds; a private lease carries one reentrant owner's
// entry; a foreign lease is another Backend's private lease, found under
// an entry a reentrant owner joined.
type leaseState struct {
	sec     int64         // TTL asked for, in seconds (foreign: as granted, once known)
	ready   chan struct{} // closed once id or err is set
	id      clientv3.LeaseID
	err     error // the grant failed
	private bool  // granted for one reentrant owner's entry

	// Guarded by Backend.mu.
	validUntil time.Time // send time of the last successful grant/keep-alive + granted TTL
	granted    int64     // TTL the server granted, in seconds (0: unknown)
	dead       error     // set once the lease is known or presumed gone
	foreign    bool      // granted by another Backend (entry joined by a reentrant owner)
}

func (ls *leaseState) isReady() bool {
	select {
	case <-ls.ready:
		return true
	default:
		return false
	}
}

// isLeaseNotFound reports etcd's "requested lease not found".
func isLeaseNotFound(err error) bool {
	return err != nil && (errors.Is(err, rpctypes.ErrLeaseNotFound) ||
		rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(rpctypes.ErrGRPCLeaseNotFound))
}

// MinTTL implements dlock.TTLFloor: it returns the package's MinTTL.
func (b *Backend) MinTTL() time.Duration { return MinTTL }

// TryBeforeQueue implements dlock.QueueTrier: a failed attempt creates no
// entry (its transaction only compares), except a permit's, which creates
// and deletes one (see tryKind).
func (b *Backend) TryBeforeQueue() bool { return true }

// ttlSeconds converts a lock TTL to a lease TTL: whole seconds, rounded up.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl < MinTTL {
		return 0, fmt.Errorf("etcdlock: TTL %v is below etcd's minimum lease TTL %v: %w", ttl, MinTTL, dlock.ErrInvalidTTL)
	}
	if ttl > maxTTL {
		return 0, fmt.Errorf("etcdlock: TTL %v is above etcd's maximum lease TTL %v: %w", ttl, maxTTL, dlock.ErrInvalidTTL)
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

// lease returns the live lease for TTLs of sec seconds, granting one when
// there is none (one grant at a time per TTL: concurrent callers wait for
// it). A lease whose validity passed without renewal is presumed expired:
// its locks are reported lost and a new lease is granted.
func (b *Backend) lease(ctx context.Context, sec int64) (*leaseState, error) {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, errClosed
		}
		ls := b.leases.shared[sec]
		if ls != nil && ls.isReady() && ls.err == nil && !time.Now().Before(ls.validUntil) {
			lost := b.retireLocked(ls, fmt.Errorf("etcdlock: lease %x was not renewed within its TTL of %ds: %w", int64(ls.id), ls.sec, dlock.ErrNotHeld))
			b.mu.Unlock()
			lost.fire()
			continue
		}
		if ls == nil {
			ls = &leaseState{sec: sec, ready: make(chan struct{})}
			b.leases.shared[sec] = ls
			b.mu.Unlock()
			return ls, b.grant(ctx, ls)
		}
		b.mu.Unlock()
		select {
		case <-ls.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if ls.err == nil {
			return ls, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// The grant failed for its caller (maybe only its context ended):
		// try again with ours.
		if !errors.Is(ls.err, context.Canceled) && !errors.Is(ls.err, context.DeadlineExceeded) {
			return nil, ls.err
		}
	}
}

// privateLease returns a lease of sec seconds for one reentrant owner's
// entry: the Backend's spare one if it has one valid for at least half its
// TTL, else a new one.
func (b *Backend) privateLease(ctx context.Context, sec int64) (*leaseState, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, errClosed
	}
	ls := b.leases.spare[sec]
	delete(b.leases.spare, sec)
	if ls != nil && ls.dead == nil && time.Until(ls.validUntil) > time.Duration(ls.granted)*time.Second/2 {
		b.mu.Unlock()
		return ls, nil
	}
	b.mu.Unlock()
	ls = &leaseState{sec: sec, ready: make(chan struct{}), private: true}
	return ls, b.grant(ctx, ls)
}

// putSpare keeps ls, a private lease known to carry no entry, for the
// next reentrant acquisition of its TTL (at most one per TTL; others
// expire unused).
func (b *Backend) putSpare(ls *leaseState) {
	if ls == nil || !ls.private {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls.dead == nil && !b.closed && b.leases.spare[ls.sec] == nil {
		b.leases.spare[ls.sec] = ls
	}
}

// longEnough reports whether ls is known to be granted for at least ttl.
func (b *Backend) longEnough(ls *leaseState, ttl time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Duration(ls.granted)*time.Second >= ttl
}

// leaseOf returns the lease for a new entry of r: the shared lease of its
// TTL, or a private one for a reentrant request.
func (b *Backend) leaseOf(ctx context.Context, r dlock.Request, sec int64) (*leaseState, error) {
	if r.Reentrant {
		return b.privateLease(ctx, sec)
	}
	return b.lease(ctx, sec)
}

// grant asks etcd for the lease ls and publishes the result.
func (b *Backend) grant(ctx context.Context, ls *leaseState) error {
	send := time.Now()
	resp, err := b.cli.Grant(ctx, ls.sec)
	if err != nil {
		// A grant cut short by its caller's deadline fails with the
		// context's error, so the calls waiting for ls try again.
		err = rpcErr(ctx, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	defer close(ls.ready)
	if err != nil {
		ls.err = fmt.Errorf("etcdlock: grant lease of %ds: %w", ls.sec, err)
		if b.leases.shared[ls.sec] == ls {
			delete(b.leases.shared, ls.sec)
		}
		return ls.err
	}
	ls.id = resp.ID
	ls.granted = resp.TTL
	ls.validUntil = send.Add(time.Duration(resp.TTL) * time.Second)
	if b.closed {
		// Close ran meanwhile and did not see this lease: it expires by
		// itself within its TTL, with nothing attached.
		ls.err = errClosed
		return errClosed
	}
	return nil
}

// keepAlive renews ls once. It returns errLeaseGone (matching
// dlock.ErrNotHeld) when etcd no longer has the lease, after reporting
// every lock on it lost.
func (b *Backend) keepAlive(ctx context.Context, ls *leaseState) error {
	b.mu.Lock()
	dead := ls.dead
	b.mu.Unlock()
	if dead != nil {
		return dead
	}
	send := time.Now()
	resp, err := b.cli.KeepAliveOnce(ctx, ls.id)
	if err != nil {
		if isLeaseNotFound(err) {
			return b.leaseGone(ls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(ls.id), dlock.ErrNotHeld))
		}
		return fmt.Errorf("etcdlock: keep-alive lease %x: %w", int64(ls.id), rpcErr(ctx, err))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls.dead != nil {
		return ls.dead
	}
	ls.granted = resp.TTL
	if ls.foreign {
		ls.sec = resp.TTL
	}
	if v := send.Add(time.Duration(resp.TTL) * time.Second); v.After(ls.validUntil) {
		ls.validUntil = v
	}
	return nil
}

// fresh reports whether ls is known valid until at least until.
func (b *Backend) fresh(ls *leaseState, until time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return ls.dead == nil && !ls.validUntil.Before(until)
}

// renewAt returns when a holder of ls should renew it: a third of its
// TTL after the last renewal.
func (b *Backend) renewAt(ls *leaseState) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return ls.validUntil.Add(-2 * time.Duration(ls.sec) * time.Second / 3)
}

// retryDelay is how soon a failed keep-alive of ls is tried again: a
// tenth of its TTL.
func (b *Backend) retryDelay(ls *leaseState) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Duration(max(ls.sec, 1)) * time.Second / 10
}

// ensureFresh makes sure ls is valid now and until at least start+ttl,
// with one keep-alive if needed. A lock granted at start is thus never
// shorter on the server than the lease the Client computes from start.
func (b *Backend) ensureFresh(ctx context.Context, ls *leaseState, start time.Time, ttl time.Duration) error {
	if now := time.Now(); b.fresh(ls, start.Add(ttl)) && b.fresh(ls, now) {
		return nil
	}
	return b.keepAlive(ctx, ls)
}

// startFresh runs ensureFresh concurrently with the caller's next round
// trip; the returned function waits for it and returns its error.
func (b *Backend) startFresh(ctx context.Context, ls *leaseState, start time.Time, ttl time.Duration) func() error {
	if b.fresh(ls, start.Add(ttl)) {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() { done <- b.keepAlive(ctx, ls) }()
	return func() error { return <-done }
}

// leaseGone marks ls as gone on the server, reports its locks lost and
// returns cause.
func (b *Backend) leaseGone(ls *leaseState, cause error) error {
	b.mu.Lock()
	lost := b.retireLocked(ls, cause)
	err := ls.dead
	b.mu.Unlock()
	lost.fire()
	return err
}

// retireLocked stops using ls for new locks and marks every lock on it
// lost. b.mu must be held; the caller fires the result after unlocking.
func (b *Backend) retireLocked(ls *leaseState, cause error) lossList {
	if ls.dead != nil {
		return nil
	}
	ls.dead = cause
	if b.leases.shared[ls.sec] == ls {
		delete(b.leases.shared, ls.sec)
	}
	var lost lossList
	for _, h := range b.holds.byName {
		if h.lease == ls {
			lost = append(lost, b.markLostLocked(h, cause)...)
		}
	}
	return lost
}

// leaseFor returns the leaseState for an entry attached to lease id: one
// of the Backend's own, or a foreign one (an entry created by another
// Backend and joined by a reentrant owner).
func (b *Backend) leaseFor(id clientv3.LeaseID) *leaseState {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ls := range b.leases.shared {
		if ls.isReady() && ls.err == nil && ls.id == id {
			return ls
		}
	}
	for _, h := range b.holds.byName {
		if h.lease.id == id {
			return h.lease
		}
	}
	ready := make(chan struct{})
	close(ready)
	return &leaseState{id: id, ready: ready, foreign: true}
}

// renewedAt returns the send time of ls's last grant or keep-alive when it
// was at most ttl/10 ago: a lock granted now on ls at the end of Wait may
// count its lifetime of ttl from then (Grant.Since, which the Client
// honours for a queue wait's grant) instead of from the start of the
// call, which saves the keep-alive that would otherwise make the lease
// outlive the call's start + ttl. The lock's local deadline is then at
// most ttl/10 earlier than asked. TryAcquire, whose grant the Client
// counts from the start of the call whatever Grant.Since says, uses
// lifeFrom instead. ok is false when the renewal is older, the lease is
// not valid for ttl from it, or reuseRenewal is off.
func (b *Backend) renewedAt(ls *leaseState, ttl time.Duration) (sent time.Time, ok bool) {
	if !b.tune.reuseRenewal {
		return time.Time{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls.dead != nil || ls.foreign || !ls.isReady() || ls.err != nil {
		return time.Time{}, false
	}
	sent = ls.validUntil.Add(-time.Duration(ls.sec) * time.Second)
	if time.Since(sent) > ttl/10 || ls.validUntil.Before(sent.Add(ttl)) {
		return time.Time{}, false
	}
	return sent, true
}

// lifeFrom returns how long from start ls is known to be valid, when its
// last renewal was sent before start and at most ttl/10 ago (see
// renewedAt): a TryAcquire may then grant its lock for that long, counted
// from the start of the call (Grant.TTL, at least 9/10 of ttl), instead of
// renewing the lease. ok is false otherwise (startFresh then renews the
// lease unless it is valid for ttl from start already).
func (b *Backend) lifeFrom(ls *leaseState, start time.Time, ttl time.Duration) (life time.Duration, ok bool) {
	sent, ok := b.renewedAt(ls, ttl)
	if !ok || !sent.Before(start) {
		return 0, false
	}
	b.mu.Lock()
	life = ls.validUntil.Sub(start)
	b.mu.Unlock()
	if life <= 0 || life >= ttl {
		return 0, false
	}
	return life, true
}
