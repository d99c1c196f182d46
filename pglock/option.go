package pglock

import (
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
)

// Defaults used when no option overrides them.
const (
	// DefaultSchema is the schema the backend creates and uses: tables
	// locks and waiters, sequence fence.
	DefaultSchema = "dlock"

	// DefaultWaiterTTL is how long a waiter's row stays eligible for a
	// wake-up without a heartbeat from its listener connection (renewed
	// every DefaultWaiterTTL/3).
	DefaultWaiterTTL = 3 * time.Second

	// DefaultSweepInterval is how often a Backend deletes lock and waiter
	// rows that expired (or were freed) more than a sweep interval ago.
	DefaultSweepInterval = 30 * time.Second
)

// An Option configures a Backend in New. Invalid values are never
// corrected: New records the first error, Backend.Err returns it and every
// call on the Backend fails with it (matching dlock.ErrInvalidOption).
type Option func(*config) error

type config struct {
	schema    string
	listen    *pgx.ConnConfig // nil: the pool's connection config
	noListen  bool
	waiterTTL time.Duration
	sweep     time.Duration
}

func defaultConfig() config {
	return config{schema: DefaultSchema, waiterTTL: DefaultWaiterTTL, sweep: DefaultSweepInterval}
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// WithSchema sets the schema that holds the backend's tables. Default
// DefaultSchema ("dlock"). The name must be a lower-case SQL identifier
// (letters, digits, underscore; at most 63 bytes), else it is an
// ErrInvalidOption error. The backend creates the schema if it does not
// exist and refuses to use one it did not create.
func WithSchema(name string) Option {
	return func(c *config) error {
		if !identRE.MatchString(name) {
			return fmt.Errorf("pglock: %w: schema %q is not a lower-case identifier of at most 63 bytes", dlock.ErrInvalidOption, name)
		}
		c.schema = name
		return nil
	}
}

// WithListenConfig sets the connection the backend opens for LISTEN, the
// one session it keeps. Default: a copy of the pool's connection config.
// Behind a transaction-pooling proxy (PgBouncer pool_mode=transaction),
// where LISTEN does not work, point it at the server directly or use
// WithoutListen. A nil config is an ErrInvalidOption error.
func WithListenConfig(cfg *pgx.ConnConfig) Option {
	return func(c *config) error {
		if cfg == nil {
			return fmt.Errorf("pglock: %w: nil listen config", dlock.ErrInvalidOption)
		}
		c.listen = cfg.Copy()
		return nil
	}
}

// WithoutListen turns off release notifications: the backend keeps no
// session, and waiters retry when the holder's TTL or the wait strategy's
// delay runs out. Default: notifications on.
func WithoutListen() Option {
	return func(c *config) error {
		c.noListen = true
		return nil
	}
}

// WithWaiterTTL sets how long a waiter stays eligible for a wake-up
// without a heartbeat. Default DefaultWaiterTTL (3s). A waiter whose
// process died is skipped by releases after at most this long. Below
// 100ms is an ErrInvalidOption error.
func WithWaiterTTL(d time.Duration) Option {
	return func(c *config) error { return setAtLeast(&c.waiterTTL, d, 100*time.Millisecond, "waiter TTL") }
}

// WithSweepInterval sets how often the Backend deletes rows of locks and
// waiters that expired, or were freed, more than an interval ago. Such
// rows are free locks already; a lock row keeps its key's last fence until
// it is deleted (see "Fences" in the package documentation). Default
// DefaultSweepInterval (30s). Below 10s is an ErrInvalidOption error.
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) error { return setAtLeast(&c.sweep, d, 10*time.Second, "sweep interval") }
}

// setAtLeast sets *field to d and returns nil, or returns an
// ErrInvalidOption error naming what when d is below floor.
func setAtLeast(field *time.Duration, d, floor time.Duration, what string) error {
	if d < floor {
		return fmt.Errorf("pglock: %w: %s %v is below %v", dlock.ErrInvalidOption, what, d, floor)
	}
	*field = d
	return nil
}
