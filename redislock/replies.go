package redislock

import (
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
)

// Reply codes of the scripts: the first element of an array reply
// (acquire.lua, acquire_all.lua, queue.lua, inspect.lua) or the integer
// reply (release.lua, refresh.lua, leave.lua, agree.lua).
const (
	codeGranted   = 1  // acquire: {1, fence, count}; inspect: {1, owner, count, fence, pttl, waiters}
	codeHeld      = 0  // acquire: {0, pttl}; queue: {0, -1, seq, 0, deadline}; inspect: {0, waiters}
	codeWrongType = -1 // {-1, key, type}: a key holds a value of another type, nothing changed

	codeNotHeld   = 0 // release, refresh, agree: the token does not hold the lock
	codeDone      = 1 // release: last hold given up; refresh: extended; agree: adopted
	codeStillHeld = 2 // release: one hold given up, the token still holds the lock
)

// parseGrant reads an acquisition's reply (acquire.lua, queue.lua).
func parseGrant(v any, err error) (dlock.Grant, error) {
	g, _, err := parseGrantClock(v, err)
	return g, err
}

// parseGrantClock reads an acquisition's reply and, for a fresh grant,
// the server time (µs) the script saw; 0 when the reply has none.
func parseGrantClock(v any, err error) (dlock.Grant, int64, error) {
	if err != nil {
		return dlock.Grant{}, 0, err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return dlock.Grant{}, 0, unexpected("acquire", v)
	}
	code, _ := a[0].(int64)
	switch code {
	case codeGranted:
		fence, ok1 := a[1].(int64)
		count, ok2 := int64(1), true
		if len(a) > 2 {
			count, ok2 = a[2].(int64)
		}
		if !ok1 || !ok2 || fence <= 0 {
			return dlock.Grant{}, 0, unexpected("acquire", v)
		}
		var now int64
		if len(a) > 3 {
			now, _ = a[3].(int64)
		}
		return dlock.Grant{OK: true, Fence: uint64(fence), Count: int(count)}, now, nil
	case codeHeld:
		pttl, ok := a[1].(int64)
		if !ok {
			return dlock.Grant{}, 0, unexpected("acquire", v)
		}
		var g dlock.Grant
		if pttl >= 0 {
			// PTTL rounds down: 0 means "under a millisecond left".
			g.HolderTTL = time.Duration(max(pttl, 1)) * time.Millisecond
		}
		return g, 0, nil
	case codeWrongType:
		return dlock.Grant{}, 0, wrongType(a, false)
	}
	return dlock.Grant{}, 0, unexpected("acquire", v)
}

// parseRefresh reads refresh.lua's reply (see parseChange).
func parseRefresh(v any, key string) error { return parseChange(v, "refresh", key, false) }

// parseRelease reads release.lua's reply (see parseChange), in which
// codeStillHeld is a success too.
func parseRelease(v any, key string) error { return parseChange(v, "release", key, true) }

// parseChange reads the reply of script op that changes a grant of key:
// nil when done (or, with stillHeld, when holds remain), an error matching
// dlock.ErrNotHeld when the grant does not hold the lock or the key holds
// another type, or an unexpected-reply error.
func parseChange(v any, op, key string, stillHeld bool) error {
	switch v := v.(type) {
	case int64:
		switch {
		case v == codeDone, stillHeld && v == codeStillHeld:
			return nil
		case v == codeNotHeld:
			return notHeld(op, key)
		}
	case []any:
		if len(v) > 0 && v[0] == int64(codeWrongType) {
			return wrongType(v, true)
		}
	}
	return unexpected(op, v)
}

func notHeld(op, key string) error {
	return fmt.Errorf("redislock: %s %q: %w", op, key, dlock.ErrNotHeld)
}

func unexpected(op string, v any) error {
	return fmt.Errorf("redislock: %s: unexpected reply %v from the script", op, v)
}

// wrongTypeError reports a lock or fence key that holds a value of another
// type (a user's list under the lock's name, say). It matches
// dlock.ErrWrongType, and dlock.ErrNotHeld when returned by Release or
// Refresh (the owner cannot hold a lock that is not there).
type wrongTypeError struct {
	key, kind string
	notHeld   bool
}

func (e *wrongTypeError) Error() string {
	if e.notHeld {
		return fmt.Sprintf("redislock: lock not held: key %q holds a %s, not a dlock lock; nothing was changed", e.key, e.kind)
	}
	return fmt.Sprintf("redislock: key %q holds a %s, not a dlock lock; nothing was changed", e.key, e.kind)
}

func (e *wrongTypeError) Is(target error) bool {
	return target == dlock.ErrWrongType || (e.notHeld && target == dlock.ErrNotHeld)
}

func wrongType(a []any, notHeld bool) error {
	e := &wrongTypeError{key: "?", kind: "value of another type", notHeld: notHeld}
	if len(a) > 1 {
		if s, ok := a[1].(string); ok {
			e.key = s
		}
	}
	if len(a) > 2 {
		if s, ok := a[2].(string); ok {
			e.kind = s
		}
	}
	return e
}

// readersHold reports whether an acquire reply refused the lock because
// read holds hold the key (its third element is 1).
func readersHold(v any) bool {
	a, ok := v.([]any)
	if !ok || len(a) < 3 {
		return false
	}
	code, _ := a[0].(int64)
	n, _ := a[2].(int64)
	return code == codeHeld && n == 1
}
