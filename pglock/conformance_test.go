package pglock_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/pglock"
)

func TestConformance(t *testing.T) {
	dlocktest.Run(t, harness(func(pool *pgxpool.Pool) dlock.Backend {
		return closingPool{pglock.New(pool), pool}
	}))
}

// The session mode is not SessionBound: a lock that is not renewed ends
// at its TTL (the server ends the idle session, the row's deadline
// passes), so the suite's expiry cases run too.
func TestSessionConformance(t *testing.T) {
	dlocktest.Run(t, harness(func(pool *pgxpool.Pool) dlock.Backend {
		return closingSession{pglock.NewSession(pool), pool}
	}))
}

// harness returns the suite's harness for backends that newBackend builds
// on a new pool each; outages pause the server.
func harness(newBackend func(*pgxpool.Pool) dlock.Backend) dlocktest.Harness {
	return dlocktest.Harness{
		NewBackend: func(t *testing.T) dlock.Backend { return newBackend(newPool(t)) },
		TTL:        ttl,
		Outage:     locktest.Outage("postgres", srv),
	}
}

// closingPool is a Backend that also closes its pool when the suite
// closes it, as a process that exits would: the stress case replaces
// Clients for minutes, and open pools would exhaust max_connections.
type closingPool struct {
	*pglock.Backend
	pool *pgxpool.Pool
}

func (c closingPool) Close() error { return closeWithPool(c.Backend, c.pool) }

// closingSession is closingPool for the session mode.
type closingSession struct {
	*pglock.SessionBackend
	pool *pgxpool.Pool
}

func (c closingSession) Close() error { return closeWithPool(c.SessionBackend, c.pool) }

// closeWithPool closes b, then pool, and returns b's error.
func closeWithPool(b dlock.Backend, pool *pgxpool.Pool) error {
	err := b.Close()
	pool.Close()
	return err
}
