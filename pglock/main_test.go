package pglock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/locktest/testmain"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// srv is the PostgreSQL server shared by the tests of this package,
// started once by TestMain; the conformance suite pauses and resumes it.
var srv *testserver.Postgres

// dsn is the test server's connection URL, for the examples.
var dsn string

func TestMain(m *testing.M) {
	var err error
	if srv, err = testserver.StartPostgres(testserver.PostgresOptions{}); err != nil {
		testmain.Fail("pglock", err)
	}
	dsn = srv.DSN()
	testmain.Run(m, "pglock", srv.Stop)
}

// ttl is the lease TTL of most tests.
const ttl = 500 * time.Millisecond

// openPool returns a pool for the connection URL url, its configuration
// changed by tune; the pool is closed when the test ends.
func openPool(t testing.TB, url string, tune ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tune {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgxpool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newPool returns a pool on the test server, closed when the test ends.
// Statements run without prepared statements, as through a
// transaction-pooling proxy.
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return openPool(t, srv.DSN()+"&pool_max_conns=4&default_query_exec_mode=exec")
}

// newBackend returns a Backend on a new pool, configured by opts; both
// are closed when the test ends.
func newBackend(t testing.TB, opts ...pglock.Option) *pglock.Backend {
	t.Helper()
	return locktest.Closing(t, pglock.New(newPool(t), opts...))
}

// newSession is newBackend for the session mode.
func newSession(t testing.TB, opts ...pglock.Option) *pglock.SessionBackend {
	t.Helper()
	return locktest.Closing(t, pglock.NewSession(newPool(t), opts...))
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

// parked returns once the Client whose locktest.Waiting channel is
// waiting reports that an acquisition waits; it fails the test if the
// acquisition started by locktest.Go whose outcome got receives ends
// first.
func parked(t *testing.T, waiting <-chan struct{}, got <-chan locktest.Outcome) {
	t.Helper()
	select {
	case <-waiting:
	case r := <-got:
		t.Fatalf("waiter ended before it waited: lease %v, error %v", r.Lease != nil, r.Err)
	}
}

// granted makes one attempt with r through b and returns its grant; it
// fails the test unless the attempt was granted.
func granted(t *testing.T, ctx context.Context, b dlock.Backend, r dlock.Request) dlock.Grant {
	t.Helper()
	g, err := b.TryAcquire(ctx, r)
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire(%s): got %+v, %v; want granted", r.Token, g, err)
	}
	return g
}
