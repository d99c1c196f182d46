package dlock

import (
	"fmt"
	"time"
)

// Defaults used when no option overrides them.
const (
	// DefaultTTL is the lease lifetime: a holder that crashes keeps the lock
	// at most this long. With auto-renew (the default) a live holder keeps
	// the lock as long as it wants.
	DefaultTTL = 30 * time.Second

	// DefaultReleaseTimeout bounds the release that Do and Close perform
	// with a fresh context.
	DefaultReleaseTimeout = 5 * time.Second

	// MinTTL is the smallest TTL any backend accepts.
	MinTTL = time.Millisecond

	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 1024
)

// DefaultWait is the wait strategy used when WithWait is not given:
// Exponential(10ms, 1s). With notification wake-up this is only the
// ceiling of each wait, not a polling interval.
var DefaultWait = Exponential(10*time.Millisecond, time.Second)

// An Option configures a Client (in New) or a single call (Acquire,
// TryAcquire, Do). Invalid values are never corrected: New records the
// error, Client.Err returns it and every call fails with it; a per-call
// option with an invalid value fails that call.
type Option func(*config) error

type config struct {
	ttl            time.Duration
	ttlSet         bool // WithTTL was given
	wait           WaitStrategy
	autoRenew      bool
	owner          string
	fifo           bool
	releaseTimeout time.Duration
	onLost         func(*Lease, error)
	observers      []Observer
	minHold        time.Duration
	maxHold        time.Duration
	value          string // Election.Campaign's value

	group *holdGroup // per call: the owner's group whose gate the call holds
}

func defaultConfig() config {
	return config{
		ttl:            DefaultTTL,
		wait:           DefaultWait,
		autoRenew:      true,
		releaseTimeout: DefaultReleaseTimeout,
	}
}

func errInvalid(what string) error { return fmt.Errorf("%w: %s", ErrInvalidOption, what) }

func (c *config) apply(opts []Option) error {
	for _, o := range opts {
		if o == nil {
			return fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o(c); err != nil {
			return err
		}
	}
	if c.maxHold > 0 && c.maxHold < c.minHold {
		return fmt.Errorf("%w: maximum hold %v is below the minimum hold %v", ErrInvalidOption, c.maxHold, c.minHold)
	}
	return nil
}

// WithTTL sets the lease lifetime. Default DefaultTTL (30s), or the
// backend's maximum when it is lower (TTLLimiter: a session
// timeout). A TTL below
// MinTTL (1ms) is an ErrInvalidTTL error. The watchdog renews every TTL/3.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) error {
		if ttl < MinTTL {
			return fmt.Errorf("%w: %v is below the minimum %v", ErrInvalidTTL, ttl, MinTTL)
		}
		c.ttl, c.ttlSet = ttl, true
		return nil
	}
}

// WithWait sets how Acquire waits while the lock is held elsewhere.
// Default DefaultWait (Exponential(10ms, 1s), until the context ends).
// A nil or invalid strategy is an ErrInvalidOption error.
func WithWait(s WaitStrategy) Option {
	return func(c *config) error {
		if err := checkStrategy(s); err != nil {
			return fmt.Errorf("%w: wait strategy: %w", ErrInvalidOption, err)
		}
		c.wait = s
		return nil
	}
}

// WithAutoRenew turns the watchdog on or off. Default on: the Client
// renews every lease every TTL/3 until it is released, and reports it lost
// (Lease.Done closes) when renewals fail until the lease could have
// expired. Off: the lease simply ends at Expires; Done closes then, and
// Err returns ErrLost.
func WithAutoRenew(on bool) Option {
	return func(c *config) error {
		c.autoRenew = on
		return nil
	}
}

// WithOwner makes locks reentrant for the owner id: an Acquire of a key
// that id already holds returns at once with the same fence and a higher
// hold count, and only the last Release frees the lock. Go has no thread
// identity, so the caller names the owner (a request id, a job id).
// Default: no owner, every lease gets a random unique token and is not
// reentrant. An empty id, or one longer than MaxKeyLen, is an
// ErrInvalidOption error.
func WithOwner(id string) Option {
	return func(c *config) error {
		if id == "" || len(id) > MaxKeyLen {
			return fmt.Errorf("%w: owner id must be 1..%d bytes, got %d", ErrInvalidOption, MaxKeyLen, len(id))
		}
		c.owner = id
		return nil
	}
}

// WithFIFO asks for strict arrival order among waiters, served by a
// server-side queue. Default off, except that backends whose only waiting
// mode is a queue are always FIFO. A backend without a queue fails
// Acquire with ErrInvalidOption.
func WithFIFO() Option {
	return func(c *config) error {
		c.fifo = true
		return nil
	}
}

// WithReleaseTimeout bounds the release that Do and Close perform with a
// fresh context after the caller's context may have ended. Default
// DefaultReleaseTimeout (5s). A value ≤ 0 is an ErrInvalidOption error.
func WithReleaseTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: release timeout %v must be positive", ErrInvalidOption, d)
		}
		c.releaseTimeout = d
		return nil
	}
}

// WithOnLost registers fn to be called once for each lease that is lost
// (never for a lease that is released), in addition to Lease.Done closing.
// fn runs on its own goroutine and must not block for long. Default none.
func WithOnLost(fn func(l *Lease, cause error)) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("%w: nil OnLost function", ErrInvalidOption)
		}
		c.onLost = fn
		return nil
	}
}

// WithMinHold keeps the lock on the server at least d after the grant: a
// Release before then ends the lease at once but gives the lock back only
// when d has passed (see the package overview). Default 0: Release gives
// the lock back at once. A d < 0 is an ErrInvalidOption error.
func WithMinHold(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: minimum hold %v is negative", ErrInvalidOption, d)
		}
		c.minHold = d
		return nil
	}
}

// WithMaxHold ends a lease d after its grant whatever the watchdog would
// do: the Client gives the lock back and the lease ends with an error
// matching ErrLost and ErrMaxHold (Done closes, contexts are cancelled).
// If that release fails the lock expires by its TTL. Default 0: no limit.
// A d < 0, or a d below the minimum hold, is an ErrInvalidOption error.
func WithMaxHold(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: maximum hold %v is negative", ErrInvalidOption, d)
		}
		c.maxHold = d
		return nil
	}
}
