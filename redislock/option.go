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
	// backend uses: lock "dlock:{KEY}", fence counter "dlock:{KEY}:fence",
	// release channel "dlock:{KEY}:rel".
	DefaultPrefix = "dlock:"

	// DefaultSubscribeTimeout bounds how long Subscribe waits for the server
	// to confirm a subscription, and is the health-check interval of the
	// shared subscription connection.
	DefaultSubscribeTimeout = 3 * time.Second

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
}

func defaultConfig() config {
	return config{prefix: DefaultPrefix, subTimeout: DefaultSubscribeTimeout}
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

// WithSubscribeTimeout bounds how long Subscribe waits for the server to
// confirm a new subscription (Subscribe then fails), and sets the health
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
