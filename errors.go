package dlock

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors shared by the Client and every backend. Match them with
// errors.Is: the errors returned by dlock wrap them with the key and the cause.
var (
	// ErrNotAcquired reports that a lock was not obtained: it was held by
	// another owner and the wait strategy gave up, or the caller's context
	// ended the wait. In the second case the error also matches the
	// context's error (context.Canceled or context.DeadlineExceeded).
	ErrNotAcquired = errors.New("dlock: lock not acquired")

	// ErrLost reports that a lease ended without being released by its
	// holder: it expired before it could be renewed, the backend reported it
	// gone (taken over, deleted, session expired), or the server stopped
	// answering for longer than the lease's validity.
	ErrLost = errors.New("dlock: lease lost")

	// ErrNotHeld reports that the backend does not hold the lock for this
	// owner token: it expired and may have been taken over. Returned by
	// Release and Refresh; the lock, if someone else holds it, is untouched.
	ErrNotHeld = errors.New("dlock: lock not held by this owner")

	// ErrMaxHold reports a lease ended by WithMaxHold. Errors that match it
	// also match ErrLost.
	ErrMaxHold = errors.New("dlock: lease reached its maximum hold time")

	// ErrMinHold reports a lease released within its minimum hold
	// (WithMinHold) whose lock the server could not be made to keep until
	// the hold's end: it is freed at its current expiry, earlier.
	ErrMinHold = errors.New("dlock: lock not kept for its minimum hold")

	// ErrReleased reports an operation on a lease that was already released.
	ErrReleased = errors.New("dlock: lease already released")

	// ErrClosed reports an operation on a closed Client.
	ErrClosed = errors.New("dlock: client closed")

	// ErrInvalidKey reports an empty key or one longer than MaxKeyLen bytes.
	ErrInvalidKey = errors.New("dlock: invalid key")

	// ErrInvalidTTL reports a TTL below MinTTL (1 ms) or, for backends with a
	// larger minimum (TTLFloor), below that backend's minimum.
	ErrInvalidTTL = errors.New("dlock: invalid TTL")

	// ErrInvalidOption reports an option with an invalid value (a nil
	// strategy, a negative duration, an empty owner, a nil backend, ...).
	ErrInvalidOption = errors.New("dlock: invalid option")

	// ErrWrongType reports that the key a request needs already holds
	// data of another kind: written by something other than dlock (for
	// example a list under the same name), or dlock holds of another kind
	// (a permit asked of a key held as a lock or by readers, and the
	// like). Nothing is overwritten.
	ErrWrongType = errors.New("dlock: key holds a value that is not a dlock lock")
)

// NodeError is the failure of one server among several (quorum nodes, a
// cluster shard). Errors from several nodes are joined with errors.Join.
type NodeError struct {
	Node string // the node's address or name
	Err  error  // what went wrong on that node
}

// Error returns "dlock: node ADDR: CAUSE".
func (e *NodeError) Error() string {
	return fmt.Sprintf("dlock: node %s: %v", e.Node, trimPrefix(e.Err))
}

// Unwrap returns the node's error.
func (e *NodeError) Unwrap() error { return e.Err }

// AcquireError is returned when an acquisition ends without the lock. It
// always matches ErrNotAcquired. When the caller's context ended the wait
// it also matches ctx.Err() and Cause holds context.Cause(ctx) (a cause of
// its own set with context.WithCancelCause or WithTimeoutCause matches
// too). When the wait strategy gave up, Cause is nil; otherwise Cause says
// why the lock could not be used (a grant that came too late).
type AcquireError struct {
	Key      string // the lock's key
	Attempts int    // attempts made, as the wait strategy counts them (a queue wait is one)
	Cause    error  // why the wait ended early, or nil when the strategy gave up
	Last     error  // the last attempt's server error, if the context ended during it

	ctxErr error // ctx.Err() when the context ended the wait
}

// Error describes the key, the attempts and the cause.
func (e *AcquireError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dlock: lock %q not acquired after %d attempt", e.Key, e.Attempts)
	if e.Attempts != 1 {
		b.WriteByte('s')
	}
	if e.Cause != nil {
		b.WriteString(": ")
		b.WriteString(trimPrefix(e.Cause))
		if e.Last != nil && e.Last != e.Cause {
			b.WriteString(" (last attempt: ")
			b.WriteString(trimPrefix(e.Last))
			b.WriteString(")")
		}
	} else {
		b.WriteString(": held by another owner, wait strategy gave up")
	}
	return b.String()
}

// Unwrap returns ErrNotAcquired and, when set, the context's error, the
// cause and the last attempt's error.
func (e *AcquireError) Unwrap() []error {
	errs := []error{ErrNotAcquired}
	if e.ctxErr != nil && e.ctxErr != e.Cause {
		errs = append(errs, e.ctxErr)
	}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	if e.Last != nil {
		errs = append(errs, e.Last)
	}
	return errs
}

// isNotAcquired reports a contention outcome (not a server failure).
func isNotAcquired(err error) bool {
	_, ok := err.(*AcquireError)
	return ok
}

// opError wraps err with the operation and key, keeping it matchable.
type opError struct {
	op  string
	key string
	err error
}

func (e *opError) Error() string {
	return fmt.Sprintf("dlock: %s %q: %s", e.op, e.key, trimPrefix(e.err))
}

func (e *opError) Unwrap() error { return e.err }

func wrapOp(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return &opError{op: op, key: key, err: err}
}

// trimPrefix drops a leading "dlock: " so wrapped messages read once.
func trimPrefix(err error) string {
	return strings.TrimPrefix(err.Error(), "dlock: ")
}
