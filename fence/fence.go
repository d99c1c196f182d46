// Package fence holds the resource-side half of fencing: checks that make
// a protected resource reject writes from a holder whose lease has been
// superseded. A lease-based lock cannot stop a paused holder from writing
// after its lease expired; the resource can, by comparing the writer's
// fence (dlock.Lease.Fence) with the highest fence it has accepted.
//
// The rule every check here applies: a write with fence f by owner o is
// accepted when f is greater than the highest fence seen for that
// resource, or equal to it and o is the owner who wrote with it (the same
// lease writing again). Anything else is rejected with ErrStale and
// changes nothing.
//
//   - Guard: in-process, for resources a single process owns.
//   - Redis: atomic check-and-set (Set) and check-and-read (Claim) scripts
//     for values kept in Redis; a read-modify-write claims on read.
//   - SQLPredicate: a WHERE clause fragment for SQL rows with a fence column.
package fence

import (
	"errors"
	"fmt"
	"sync"
)

// ErrStale reports a write carrying a fence older than one the resource
// has already accepted: its lease was superseded. Nothing was written.
var ErrStale = errors.New("dlock: fence: stale fencing token")

// StaleError is the error returned for a rejected write: it matches
// ErrStale and tells both fences.
type StaleError struct {
	Resource string // the resource written to
	Fence    uint64 // the writer's fence
	Highest  uint64 // the highest fence the resource had accepted
}

// Error describes the rejected write.
func (e *StaleError) Error() string {
	return fmt.Sprintf("dlock: fence: write to %q with fence %d rejected: fence %d already accepted", e.Resource, e.Fence, e.Highest)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Guard tracks the highest fence accepted per resource, in memory. The zero
// value is ready to use; a Guard is safe for concurrent use.
type Guard struct {
	mu   sync.Mutex
	seen map[string]seen
}

type seen struct {
	fence uint64
	owner string
}

// Check accepts a write to resource with fence by owner, or returns a
// *StaleError. An accepted fence becomes the resource's highest.
func (g *Guard) Check(resource string, fence uint64, owner string) error {
	return g.Do(resource, fence, owner, nil)
}

// Do runs write while holding the guard, only if the fence is accepted:
// check and write are one atomic step for the resource. If write returns
// an error the fence is not recorded.
func (g *Guard) Do(resource string, fence uint64, owner string, write func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.seen[resource]
	if fence < cur.fence || (fence == cur.fence && owner != cur.owner && cur.fence != 0) {
		return &StaleError{Resource: resource, Fence: fence, Highest: cur.fence}
	}
	if write != nil {
		if err := write(); err != nil {
			return err
		}
	}
	if g.seen == nil {
		g.seen = make(map[string]seen)
	}
	g.seen[resource] = seen{fence, owner}
	return nil
}

// Highest returns the highest fence accepted for resource (0 if none).
func (g *Guard) Highest(resource string) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[resource].fence
}

// SQLPredicate returns a WHERE-clause fragment that accepts a row update
// only if the row's fence column is below the writer's fence, given as the
// placeholder (e.g. "$1" or "?"). Use it together with setting the column:
//
//	UPDATE stock SET qty = qty - 1, fence = $1
//	WHERE sku = $2 AND (fence IS NULL OR fence < $1)
//
// and treat "0 rows affected" as ErrStale. Unlike Guard it rejects a
// second write with an equal fence; include the owner in the predicate if
// one lease must write the same row twice. column and placeholder are
// inserted verbatim: pass constants, never user input.
func SQLPredicate(column, placeholder string) string {
	return fmt.Sprintf("(%s IS NULL OR %s < %s)", column, column, placeholder)
}
