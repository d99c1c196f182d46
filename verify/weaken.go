package verify

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// WeakenParam is the backend URL query parameter that runs the workers on
// a deliberately weakened lock, e.g. "etcd://local?n=3&weaken=forget": a
// positive control showing that the harness sees a violation on that
// deployment. Only an OpenFunc wrapped by WithWeakening understands it.
const WeakenParam = "weaken"

// WeakenForget, as the value of WeakenParam, makes the lock forget every
// grant as soon as it is made: the deployment grants the lock as usual
// (same round trips, same fences, same faults), then the grant is released
// on the server at once while the Client is told it holds the lock, and
// later renewals and releases of a grant the server no longer has are
// acknowledged. Another worker can then be granted the lock while the
// first one's lease is live: a run must FAIL with lease overlaps, and the
// fenced register rejects the superseded holders' writes.
const WeakenForget = "forget"

// WeakenSameFence, as the value of WeakenParam, is WeakenForget with every
// grant reporting fence 1: fences no longer order the grants. A run must
// FAIL with lease overlaps and fence regressions. The fenced register,
// which breaks a tie of fences by owner, still rejects every claim but
// the first holder's, so it accepts no stale write.
const WeakenSameFence = "same-fence"

// WeakenNoFenceCheck, as the value of WeakenParam, is WeakenForget with
// the fenced register's check turned off: the workers read and write it
// without comparing fences (their fences are still recorded). A run must
// FAIL with lease overlaps and stale writes accepted by the fenced
// register.
const WeakenNoFenceCheck = "no-fence-check"

// WithWeakening returns an OpenFunc that understands WeakenParam: it
// removes the parameter from the URL, opens the backend with open, and
// wraps it as the parameter's value says. A URL without the parameter is
// passed to open unchanged; an unknown value is an error matching
// ErrInvalidConfig.
func WithWeakening(open OpenFunc) OpenFunc {
	return func(ctx context.Context, url string, ttl time.Duration) (dlock.Backend, func() error, error) {
		url, mode := cutParam(url, WeakenParam)
		if mode != "" && mode != WeakenForget && mode != WeakenSameFence && mode != WeakenNoFenceCheck {
			return nil, nil, invalid("backend URL %q: %s=%s (known: %s, %s, %s)", RedactURL(url), WeakenParam, mode, WeakenForget, WeakenSameFence, WeakenNoFenceCheck)
		}
		b, closeB, err := open(ctx, url, ttl)
		if err != nil || mode == "" {
			return b, closeB, err
		}
		return forgetful{Backend: b, sameFence: mode == WeakenSameFence}, closeB, nil
	}
}

// cutParam removes the query parameter name from url and returns the
// remaining URL and the parameter's value ("" when absent).
func cutParam(url, name string) (string, string) {
	base, query, ok := strings.Cut(url, "?")
	if !ok {
		return url, ""
	}
	value := ""
	var keep []string
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k == name {
			value = v
			continue
		}
		keep = append(keep, kv)
	}
	if len(keep) > 0 {
		base += "?" + strings.Join(keep, "&")
	}
	return base, value
}

// forgetful is the backend of every weakening. It embeds
// only dlock.Backend, so the wrapped backend's optional capabilities
// (notifications, queues, batched renewals) are hidden and waiters poll.
type forgetful struct {
	dlock.Backend
	sameFence bool // report fence 1 for every grant
}

// sameFence is the fence every grant reports under WeakenSameFence.
const sameFence = 1

// TryAcquire takes the lock on the deployment, releases that grant at once
// and reports it as held, with fence 1 under WeakenSameFence. A failed release is
// ignored: the lock then expires on its own.
func (b forgetful) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	g, err := b.Backend.TryAcquire(ctx, r)
	if err != nil || !g.OK {
		return g, err
	}
	rel := r
	rel.Fence = g.Fence
	_ = b.Backend.Release(ctx, rel)
	if b.sameFence {
		g.Fence = sameFence
	}
	return g, nil
}

// Refresh renews the grant on the deployment and reports success when the
// deployment no longer has it; other errors are returned.
func (b forgetful) Refresh(ctx context.Context, r dlock.Request) error {
	if b.sameFence {
		r.Fence = 0 // the grant's real fence is unknown here
	}
	return ignoreNotHeld(b.Backend.Refresh(ctx, r))
}

// Release releases the grant on the deployment and reports success when
// the deployment no longer has it; other errors are returned.
func (b forgetful) Release(ctx context.Context, r dlock.Request) error {
	if b.sameFence {
		r.Fence = 0
	}
	return ignoreNotHeld(b.Backend.Release(ctx, r))
}

func ignoreNotHeld(err error) error {
	if errors.Is(err, dlock.ErrNotHeld) {
		return nil
	}
	return err
}
