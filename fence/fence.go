package fence

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
)

// ErrStale reports a write carrying a fence older than one the resource
// has already accepted: its lease was superseded. Nothing was written.
var ErrStale = errors.New("dlock: fence: stale fencing token")

// StaleError is the error returned for a rejected write: it matches
// ErrStale and tells both tokens (the epochs are 0 for the plain forms).
type StaleError struct {
	Resource     string // the resource written to
	Fence        uint64 // the writer's fence
	Highest      uint64 // the fence of the highest token the resource had accepted
	Epoch        uint64 // the writer's epoch
	HighestEpoch uint64 // the epoch of the highest token the resource had accepted
}

// Error describes the rejected write.
func (e *StaleError) Error() string {
	if e.Epoch == 0 && e.HighestEpoch == 0 {
		return fmt.Sprintf("dlock: fence: write to %q with fence %d rejected: fence %d already accepted", e.Resource, e.Fence, e.Highest)
	}
	return fmt.Sprintf("dlock: fence: write to %q with %v rejected: %v already accepted", e.Resource,
		Token{e.Epoch, e.Fence}, Token{e.HighestEpoch, e.Highest})
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Token is a fence qualified by the epoch it was issued in (see Epochs in
// the package documentation). Token{Fence: f} is the plain fence f.
type Token struct {
	Epoch uint64 // raised when the resource's writers switch backend or key
	Fence uint64 // dlock.Lease.Fence of the writer's lease
}

// Compare returns -1, 0 or +1 when t is older than, equal to or newer than
// u: epochs compare first, fences break ties.
func (t Token) Compare(u Token) int {
	if t.Epoch != u.Epoch {
		return cmp.Compare(t.Epoch, u.Epoch)
	}
	return cmp.Compare(t.Fence, u.Fence)
}

// String formats t as "epoch E fence F".
func (t Token) String() string { return fmt.Sprintf("epoch %d fence %d", t.Epoch, t.Fence) }

// Guard tracks the highest token accepted per resource, in memory. The
// zero value is ready to use; a Guard is safe for concurrent use.
type Guard struct {
	mu   sync.Mutex
	seen map[string]seen
}

type seen struct {
	tok   Token
	owner string
}

// Check accepts a write to resource with fence by owner, or returns a
// *StaleError. An accepted fence becomes the resource's highest. It is
// CheckToken with epoch 0.
func (g *Guard) Check(resource string, fence uint64, owner string) error {
	return g.DoToken(resource, Token{Fence: fence}, owner, nil)
}

// Do runs write while holding the guard, only if the fence is accepted:
// check and write are one atomic step for the resource. If write returns
// an error the fence is not recorded. It is DoToken with epoch 0.
func (g *Guard) Do(resource string, fence uint64, owner string, write func() error) error {
	return g.DoToken(resource, Token{Fence: fence}, owner, write)
}

// CheckToken accepts a write to resource with tok by owner when tok is
// newer than the highest token accepted, or equal to it and written by the
// same owner; otherwise it returns a *StaleError. An accepted token
// becomes the resource's highest.
func (g *Guard) CheckToken(resource string, tok Token, owner string) error {
	return g.DoToken(resource, tok, owner, nil)
}

// DoToken runs write while holding the guard, only if tok is accepted (as
// in CheckToken). If write returns an error, DoToken returns it and the
// token is not recorded.
func (g *Guard) DoToken(resource string, tok Token, owner string, write func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.seen[resource]
	if c := tok.Compare(cur.tok); c < 0 || (c == 0 && owner != cur.owner && cur.tok != Token{}) {
		return &StaleError{Resource: resource, Fence: tok.Fence, Highest: cur.tok.Fence, Epoch: tok.Epoch, HighestEpoch: cur.tok.Epoch}
	}
	if write != nil {
		if err := write(); err != nil {
			return err
		}
	}
	if g.seen == nil {
		g.seen = make(map[string]seen)
	}
	g.seen[resource] = seen{tok, owner}
	return nil
}

// Highest returns the fence of the highest token accepted for resource (0
// if none).
func (g *Guard) Highest(resource string) uint64 {
	return g.HighestToken(resource).Fence
}

// HighestToken returns the highest token accepted for resource (the zero
// Token if none).
func (g *Guard) HighestToken(resource string) Token {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[resource].tok
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

// SQLTokenPredicate is SQLPredicate for tokens: it accepts a row update
// only if the row's (epoch, fence) columns are below the writer's token,
// given as two placeholders. Use it together with setting both columns:
//
//	UPDATE stock SET qty = qty - 1, epoch = $1, fence = $2
//	WHERE sku = $3 AND (COALESCE(epoch, 0) < $1 OR (COALESCE(epoch, 0) = $1 AND (fence IS NULL OR fence < $2)))
//
// which is what SQLTokenPredicate("epoch", "fence", "$1", "$2") returns,
// and treat "0 rows affected" as ErrStale. A row without an epoch (NULL,
// as written with SQLPredicate) is epoch 0. The arguments are inserted
// verbatim: pass constants, never user input.
func SQLTokenPredicate(epochColumn, fenceColumn, epochPlaceholder, fencePlaceholder string) string {
	epoch := fmt.Sprintf("COALESCE(%s, 0)", epochColumn)
	return fmt.Sprintf("(%s < %s OR (%s = %s AND %s))",
		epoch, epochPlaceholder, epoch, epochPlaceholder, SQLPredicate(fenceColumn, fencePlaceholder))
}
