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
// zero value is ready to use; a Guard is safe for concurrent use. Checks
// and writes of one resource are serialised; those of different resources
// run concurrently.
type Guard struct {
	mu  sync.Mutex        // guards res and the entries' refs
	res map[string]*entry // per resource with an accepted token or a call in progress
}

// entry is one resource of a Guard. ok, tok and owner are written holding
// both mu and the Guard's mu, so either suffices to read them.
type entry struct {
	mu    sync.Mutex // held by the call checking (and writing) the resource
	refs  int        // calls holding or waiting for mu
	ok    bool       // a token has been accepted
	tok   Token      // the highest token accepted, when ok
	owner string     // its owner
}

// Check accepts a write to resource with fence by owner, or returns a
// *StaleError. An accepted fence becomes the resource's highest. It is
// CheckToken with epoch 0.
func (g *Guard) Check(resource string, fence uint64, owner string) error {
	return g.DoToken(resource, Token{Fence: fence}, owner, nil)
}

// Do runs write only if fence by owner is accepted, while holding the
// resource: check and write are one atomic step for it, and writes to
// other resources run meanwhile. If write returns an error the fence is
// not recorded. It is DoToken with epoch 0.
func (g *Guard) Do(resource string, fence uint64, owner string, write func() error) error {
	return g.DoToken(resource, Token{Fence: fence}, owner, write)
}

// CheckToken accepts a write to resource with tok by owner when it is the
// resource's first, or tok is newer than the highest token accepted, or
// equal to it and written by the same owner; otherwise it returns a
// *StaleError. An accepted token becomes the resource's highest.
func (g *Guard) CheckToken(resource string, tok Token, owner string) error {
	return g.DoToken(resource, tok, owner, nil)
}

// DoToken runs write only if tok by owner is accepted (as in CheckToken),
// while holding the resource as Do does. If write returns an error,
// DoToken returns it and the token is not recorded. write must not use g
// for the same resource.
func (g *Guard) DoToken(resource string, tok Token, owner string, write func() error) error {
	e := g.hold(resource)
	defer g.release(resource, e)
	if e.ok {
		if c := tok.Compare(e.tok); c < 0 || (c == 0 && owner != e.owner) {
			return &StaleError{Resource: resource, Fence: tok.Fence, Highest: e.tok.Fence, Epoch: tok.Epoch, HighestEpoch: e.tok.Epoch}
		}
	}
	if write != nil {
		if err := write(); err != nil {
			return err
		}
	}
	g.mu.Lock()
	e.ok, e.tok, e.owner = true, tok, owner
	g.mu.Unlock()
	return nil
}

// hold returns the entry of resource, creating it, with its mutex held.
func (g *Guard) hold(resource string) *entry {
	g.mu.Lock()
	e := g.res[resource]
	if e == nil {
		if g.res == nil {
			g.res = make(map[string]*entry)
		}
		e = &entry{}
		g.res[resource] = e
	}
	e.refs++
	g.mu.Unlock()
	e.mu.Lock()
	return e
}

// release unlocks e, dropping it when no call uses it and it holds no
// accepted token.
func (g *Guard) release(resource string, e *entry) {
	e.mu.Unlock()
	g.mu.Lock()
	if e.refs--; e.refs == 0 && !e.ok {
		delete(g.res, resource)
	}
	g.mu.Unlock()
}

// Highest returns the fence of the highest token accepted for resource (0
// if none).
func (g *Guard) Highest(resource string) uint64 {
	return g.HighestToken(resource).Fence
}

// HighestToken returns the highest token accepted for resource (the zero
// Token if none). It does not wait for a write in progress.
func (g *Guard) HighestToken(resource string) Token {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.res[resource]; e != nil && e.ok {
		return e.tok
	}
	return Token{}
}

// SQLPredicate returns a WHERE-clause fragment that accepts a row update
// only if the row's fence column is NULL or below the writer's fence,
// given as placeholder (e.g. "$1" or "?"), which the fragment holds once.
// Use it together with setting the column:
//
//	UPDATE stock SET qty = qty - 1, fence = $1
//	WHERE sku = $2 AND (fence IS NULL OR fence < $1)
//
// and treat "0 rows affected" as ErrStale; with "?" placeholders that
// statement binds fence, sku, fence. Unlike Guard it rejects a second
// write with an equal fence; include the owner in the predicate if one
// lease must write the same row twice. It reads the fence column only, so
// it must not be used on rows that may carry an epoch above 0: there every
// writer uses SQLTokenPredicate, epoch-0 ones with the epoch "0" (see
// Epochs in the package documentation). column and placeholder are
// inserted verbatim: pass constants, never user input.
func SQLPredicate(column, placeholder string) string {
	return fmt.Sprintf("(%s IS NULL OR %s < %s)", column, column, placeholder)
}

// SQLTokenPredicate is SQLPredicate for tokens: it accepts a row update
// only if the row's (epoch, fence) columns are below the writer's token.
// The fragment holds epochPlaceholder twice, then fencePlaceholder once.
// Use it together with setting both columns:
//
//	UPDATE stock SET qty = qty - 1, epoch = $1, fence = $2
//	WHERE sku = $3 AND (COALESCE(epoch, 0) < $1 OR (COALESCE(epoch, 0) = $1 AND (fence IS NULL OR fence < $2)))
//
// which is what SQLTokenPredicate("epoch", "fence", "$1", "$2") returns,
// and treat "0 rows affected" as ErrStale; with "?" placeholders that
// statement binds epoch, fence, sku, epoch, epoch, fence. A row without an
// epoch (NULL) is epoch 0. A writer of epoch 0 may pass "0" as
// epochPlaceholder and set the fence column alone. The arguments are
// inserted verbatim: pass constants, never user input.
func SQLTokenPredicate(epochColumn, fenceColumn, epochPlaceholder, fencePlaceholder string) string {
	epoch := fmt.Sprintf("COALESCE(%s, 0)", epochColumn)
	return fmt.Sprintf("(%s < %s OR (%s = %s AND %s))",
		epoch, epochPlaceholder, epoch, epochPlaceholder, SQLPredicate(fenceColumn, fencePlaceholder))
}
