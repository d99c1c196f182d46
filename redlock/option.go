package redlock

import (
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// Defaults and limits.
const (
	// MaxDefaultNodeTimeout caps the default per-node timeout: without
	// WithNodeTimeout each node gets min(TTL/10, 50ms) to answer one call.
	// The Redlock description suggests 5–50 ms for a 10 s TTL: long enough
	// for a round trip on a LAN, short enough that a dead node costs little
	// of the lease's validity. Deployments whose nodes are further apart
	// (another region) must set WithNodeTimeout.
	MaxDefaultNodeTimeout = 50 * time.Millisecond

	// MinTTL is the smallest lease TTL the Backend accepts. Below it the
	// drift allowance (TTL/100 + 2ms, see Drift) and one round trip leave
	// next to no validity; calls with a smaller TTL fail with an error
	// matching dlock.ErrInvalidTTL.
	MinTTL = 10 * time.Millisecond

	// MinNodes is the smallest number of nodes New accepts (an odd number
	// is required too): with fewer, one failure stops every lock.
	MinNodes = 3

	// graceMin is the least time the stragglers of a decided fan-out get
	// (see gather).
	graceMin = 2 * time.Millisecond
)

// Drift is the clock drift allowance subtracted from a lease's TTL to get
// its validity: TTL/100 + 2ms, the figure of the Redlock description
// (servers' clocks may run up to 1% fast, plus the granularity of Redis'
// expiry). An acquisition succeeds only if TTL − elapsed − Drift(TTL) > 0,
// elapsed measured from before the first request was sent. The
// dlock.Client's Lease.Expires uses TTL/100 + min(2ms, TTL/4), the same
// for every TTL this Backend accepts (≥ MinTTL).
func Drift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

// An Option configures a Backend in NewWithOptions. Invalid values are
// never corrected: the first error is recorded, Backend.Err returns it and
// every call on the Backend fails with it (matching dlock.ErrInvalidOption).
type Option func(*config) error

type config struct {
	nodeTimeout time.Duration // 0: min(TTL/10, MaxDefaultNodeTimeout)
	subTimeout  time.Duration
	node        []redislock.Option // passed to every node's redislock.Backend
}

func defaultConfig() config {
	return config{subTimeout: redislock.DefaultSubscribeTimeout}
}

// timeout returns the per-node timeout for a lease of ttl.
func (c *config) timeout(ttl time.Duration) time.Duration {
	if c.nodeTimeout > 0 {
		return c.nodeTimeout
	}
	if ttl < MinTTL {
		return MaxDefaultNodeTimeout // a Release or Inspect without a TTL
	}
	return min(ttl/10, MaxDefaultNodeTimeout)
}

// WithNodeTimeout sets how long each node gets to answer one call
// (acquire, fence write-back, refresh, release, inspect). A node that has
// not answered by then counts as failed for that call. Default
// min(TTL/10, MaxDefaultNodeTimeout) for the lease's TTL: 50ms for TTLs
// of 500ms and more. A d ≤ 0 is an ErrInvalidOption error. Keep it well
// below the TTL: an acquisition that needs the slowest node of a quorum
// spends up to 2×d (acquire, then fence write-back) of the lease's
// validity. A batch of refreshes (the Client's watchdog renews the leases
// due together in one RefreshMany) gives each node d plus 250µs per lease
// in the batch.
func WithNodeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("redlock: %w: node timeout %v must be positive", dlock.ErrInvalidOption, d)
		}
		c.nodeTimeout = d
		return nil
	}
}

// WithPrefix sets the text that starts every Redis key and channel name
// on every node (see redislock.WithPrefix). Default redislock.DefaultPrefix
// ("dlock:"). A prefix containing '{' or '}', or longer than 256 bytes, is
// an ErrInvalidOption error.
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		// Validated by redislock.New on each node (see NewWithOptions).
		c.node = append(c.node, redislock.WithPrefix(prefix))
		return nil
	}
}

// WithSubscribeTimeout bounds how long Subscribe waits for the nodes to
// confirm a subscription (it succeeds once a quorum has), and sets the
// health check of each node's shared subscription connection (see
// redislock.WithSubscribeTimeout). Default redislock.DefaultSubscribeTimeout
// (3s). A d ≤ 0 is an ErrInvalidOption error.
func WithSubscribeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("redlock: %w: subscribe timeout %v must be positive", dlock.ErrInvalidOption, d)
		}
		c.subTimeout = d
		c.node = append(c.node, redislock.WithSubscribeTimeout(d))
		return nil
	}
}

// MinTTL implements dlock.TTLFloor: it returns MinTTL, below which the
// node timeout and the drift allowance leave no validity.
func (b *Backend) MinTTL() time.Duration { return MinTTL }
