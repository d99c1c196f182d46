package redislock

import (
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// Defaults used when no option overrides them.
const (
	// DefaultPrefix starts the name of every Redis key and channel the
	// backend uses: lock "dlock:{KEY}", queue "dlock:{KEY}:q", heartbeats
	// "dlock:{KEY}:w:MEMBER", release channel "dlock:{KEY}:rel", a
	// Backend's wake channel "dlock:wake:ID".
	DefaultPrefix = "dlock:"

	// DefaultSubscribeTimeout bounds how long Watch waits for the server
	// to confirm a subscription, and is the health-check interval of the
	// shared subscription connection.
	DefaultSubscribeTimeout = 3 * time.Second

	// DefaultWaiterTTL is how long a FIFO waiter stays queued without a
	// heartbeat, and how long a lock handed over to a waiter by a release
	// stays reserved for it without being claimed (see WithWaiterTTL).
	DefaultWaiterTTL = 400 * time.Millisecond

	// DefaultPipelines is how many pipelines of script calls a Backend has
	// in flight at once through the client's pool (see WithPipelines).
	DefaultPipelines = 2

	// maxPipelines bounds WithPipelines.
	maxPipelines = 1024

	// maxPrefixLen keeps key names within reason (the key itself is at most
	// dlock.MaxKeyLen bytes).
	maxPrefixLen = 256
)

// An Option configures a Backend in New. Invalid values are never
// corrected: New records the first error, Backend.Err returns it and every
// call on the Backend fails with it (matching dlock.ErrInvalidOption).
type Option func(*config) error

type config struct {
	prefix     string
	subTimeout time.Duration
	waiterTTL  time.Duration
	replicas   int           // WithReplicas: 0 = off
	replWait   time.Duration // WithReplicas: the WAIT timeout
	pipelines  int           // WithPipelines: 0 = every call alone
	clientPool bool          // WithClientPool
}

func defaultConfig() config {
	return config{prefix: DefaultPrefix, subTimeout: DefaultSubscribeTimeout, waiterTTL: DefaultWaiterTTL, pipelines: DefaultPipelines}
}

// WithPrefix sets the text that starts every key and channel name. Default
// DefaultPrefix ("dlock:"). The empty prefix is allowed. A prefix containing
// '{' or '}' is an ErrInvalidOption error: it would change the Redis
// Cluster hash tag, which must be the lock's key alone. So is a prefix
// longer than 256 bytes.
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if strings.ContainsAny(prefix, "{}") {
			return fmt.Errorf("redislock: %w: prefix %q contains '{' or '}'", dlock.ErrInvalidOption, prefix)
		}
		if len(prefix) > maxPrefixLen {
			return fmt.Errorf("redislock: %w: prefix is %d bytes, the limit is %d", dlock.ErrInvalidOption, len(prefix), maxPrefixLen)
		}
		c.prefix = prefix
		return nil
	}
}

// WithSubscribeTimeout bounds how long Watch and the first Wait wait for
// the server to confirm a new subscription, and sets the health
// check of the shared subscription connection: after d without traffic it
// sends a PING, and after another d without a reply it replaces the
// connection and resubscribes. Default DefaultSubscribeTimeout (3s). A d
// ≤ 0 is an ErrInvalidOption error.
func WithSubscribeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("redislock: %w: subscribe timeout %v must be positive", dlock.ErrInvalidOption, d)
		}
		c.subTimeout = d
		return nil
	}
}

// WithWaiterTTL sets the liveness bound of queued waiting: a waiter
// heartbeats every d/4 and is skipped when its heartbeat is older than d,
// and a lock handed to a waiter is reserved for it for d. A waiter that
// dies at the head of the queue delays the others by at most d + d/4.
//
// Default DefaultWaiterTTL (400ms); every Backend on the same locks should
// use the same value. A d below 10ms is an ErrInvalidOption error.
func WithWaiterTTL(d time.Duration) Option {
	return func(c *config) error {
		if d < 10*time.Millisecond {
			return fmt.Errorf("redislock: %w: waiter TTL %v is below 10ms", dlock.ErrInvalidOption, d)
		}
		c.waiterTTL = d
		return nil
	}
}

// WithReplicas makes every acquisition wait until n replicas have
// acknowledged it (WAIT n timeout, sent after the script on its
// connection). If fewer do within timeout, the lock just taken is released
// again (one hold, for a reentrant owner) and the call fails with an error
// matching ErrNotReplicated. Every attempt, FIFO heartbeats included, then
// lasts until the replicas catch up: keep timeout well below
// WithWaiterTTL. What it protects and what not: package documentation.
//
// Default off. An n < 1, a timeout below 1ms, or one not shorter than the
// client's ReadTimeout is an ErrInvalidOption error.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("redislock: %w: WithReplicas: %d replicas, want at least 1", dlock.ErrInvalidOption, n)
		}
		if timeout < time.Millisecond {
			return fmt.Errorf("redislock: %w: WithReplicas: timeout %v, want at least 1ms", dlock.ErrInvalidOption, timeout)
		}
		c.replicas, c.replWait = n, timeout
		return nil
	}
}

// WithClientPool makes the Backend send its script calls through the
// go-redis client's connection pool, batched as WithPipelines says, so that
// the client's hooks and limits see them. By default a Backend on a
// *redis.Client of one server pipelines them on a connection of its own
// (package documentation, Pipelining). A ClusterClient, a Sentinel failover
// client, a client with an OnConnect hook or a streaming credentials
// provider, and WithReplicas always use the pool.
func WithClientPool() Option {
	return func(c *config) error {
		c.clientPool = true
		return nil
	}
}

// WithPipelines sets, when the Backend sends its script calls through the
// client's pool (see WithClientPool), how many may be in flight before
// further ones are batched: the calls made meanwhile are sent together, up
// to 64 in one pipeline, when a slot frees (package documentation,
// Pipelining). n = 0 sends every call alone.
//
// Default DefaultPipelines (2). An n below 0 or above 1024 is an
// ErrInvalidOption error. Acquisitions with WithReplicas are never batched.
func WithPipelines(n int) Option {
	return func(c *config) error {
		if n < 0 || n > maxPipelines {
			return fmt.Errorf("redislock: %w: WithPipelines: %d, want 0 to %d", dlock.ErrInvalidOption, n, maxPipelines)
		}
		c.pipelines = n
		return nil
	}
}

// MinTTL is the shortest lease TTL the Backend renews reliably
// (dlock.TTLFloor). The watchdog renews every TTL/3 and gives a renewal
// until then to answer: a refresh's round trip is far shorter (p50 ≈
// 0.1ms, p99 ≈ 0.5ms on loopback), but the renewal timer, the scheduler
// and a loaded server add tens of milliseconds. Measured on 2 cores at a
// load average of 7 (a Client holding one lease, 3s): at 50ms a lease was
// lost, at 100ms and 200ms none. A Client holding many leases renews them
// in one pipeline per tick and needs more: 500 leases were all lost at
// 100ms and all kept at 200ms. The Client refuses shorter TTLs; the
// Backend itself accepts down to dlock.MinTTL.
const MinTTL = 100 * time.Millisecond

// MinTTL implements dlock.TTLFloor: it returns MinTTL.
func (b *Backend) MinTTL() time.Duration { return MinTTL }

// TryBeforeQueue implements dlock.QueueTrier: a failed attempt only reads
// the lock.
func (b *Backend) TryBeforeQueue() bool { return true }
