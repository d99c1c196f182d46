package pglock_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// srv is the PostgreSQL server shared by the tests of this package,
// started once by TestMain; the conformance suite pauses and resumes it.
var srv *testserver.Postgres

// dsn is the test server's connection URL, for the examples.
var dsn string

// testMain stops the server after the tests and before goleak looks for
// leaked goroutines (the testserver package keeps one while servers run).
type testMain struct{ m *testing.M }

func (tm testMain) Run() int {
	code := tm.m.Run()
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pglock tests: stop postgres:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func TestMain(m *testing.M) {
	var err error
	srv, err = testserver.StartPostgres(testserver.PostgresOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pglock tests:", err)
		os.Exit(1)
	}
	dsn = srv.DSN()
	goleak.VerifyTestMain(testMain{m})
}

// ttl is the lease TTL of most tests.
const ttl = 500 * time.Millisecond

// newPool returns a pool on the test server, closed when the test ends.
// Statements run without prepared statements, as through a
// transaction-pooling proxy.
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(srv.DSN() + "&pool_max_conns=4&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgxpool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newClient returns a dlock Client on a new pool and Backend, like another
// process would have; both are closed when the test ends.
func newClient(t testing.TB, opts ...dlock.Option) (*dlock.Client, *pglock.Backend) {
	t.Helper()
	b := pglock.New(newPool(t))
	c := dlock.New(b, append([]dlock.Option{dlock.WithTTL(ttl)}, opts...)...)
	if err := c.Err(); err != nil {
		t.Fatalf("dlock.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, b
}

// ctxT returns a context cancelled after d or at the end of the test.
func ctxT(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
