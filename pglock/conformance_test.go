package pglock_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

func TestConformance(t *testing.T) {
	dlocktest.Run(t, dlocktest.Harness{
		NewBackend: func(t *testing.T) dlock.Backend {
			pool := newPool(t)
			return closingPool{pglock.New(pool), pool}
		},
		TTL: ttl,
		Outage: func(t *testing.T) func() {
			t.Helper()
			if err := srv.Pause(); err != nil {
				t.Fatalf("pause postgres: %v", err)
			}
			return func() {
				if err := srv.Resume(); err != nil {
					t.Errorf("resume postgres: %v", err)
				}
			}
		},
	})
}

// closingPool is a Backend that also closes its pool when the suite
// closes it, as a process that exits would: the stress case replaces
// Clients for minutes, and open pools would exhaust max_connections.
type closingPool struct {
	*pglock.Backend
	pool *pgxpool.Pool
}

func (c closingPool) Close() error {
	err := c.Backend.Close()
	c.pool.Close()
	return err
}

// closingSession is closingPool for the session mode.
type closingSession struct {
	*pglock.SessionBackend
	pool *pgxpool.Pool
}

func (c closingSession) Close() error {
	err := c.SessionBackend.Close()
	c.pool.Close()
	return err
}
