// Package adaptertest is the test kit of the framework adapters: Main
// starts the Redis and PostgreSQL servers their tests share, and Backends
// lists a backend on each, so that every framework test runs on both.
//
// The PostgreSQL backend lives in another module, which this one does not
// require: each adapter's TestMain passes its constructor to Main (see
// Postgres).
package adaptertest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest/testmain"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// The servers the tests run on, and the backend constructor for the
// PostgreSQL one, set by Main.
var (
	redisSrv    *testserver.Redis
	pgSrv       *testserver.Postgres
	newPostgres func(t *testing.T) dlock.Backend
)

// Main starts a redis-server and a PostgreSQL server, runs the tests of m
// with postgres building the backends on the latter (see Postgres), stops
// the servers and checks for leaked goroutines (see testmain.Run); it
// exits the process. name prefixes its messages.
func Main(m *testing.M, name string, postgres func(t *testing.T) dlock.Backend) {
	newPostgres = postgres
	var err error
	if redisSrv, err = testserver.StartRedis(testserver.RedisOptions{}); err == nil {
		pgSrv, err = testserver.StartPostgres(testserver.PostgresOptions{})
	}
	if err != nil {
		redisSrv.Stop()
		testmain.Fail(name, err)
	}
	testmain.Run(m, name, func() error {
		return testserver.StopAll[interface{ Stop() error }](redisSrv, pgSrv)
	})
}

// PostgresDSN returns the connection string of the PostgreSQL server Main
// started.
func PostgresDSN() string { return pgSrv.DSN() }

// A Backend names a server and returns a new backend on it, as another
// process would have; what it opens is closed when the test ends.
type Backend struct {
	Name string
	New  func(t *testing.T) dlock.Backend
}

// Postgres returns a function building a backend on the PostgreSQL
// server, for Main: open connects to a DSN, close closes what open
// returned when the test ends, and backend builds the dlock backend on it
// (pgxpool.New, (*pgxpool.Pool).Close and a call of pglock.New).
func Postgres[P any](open func(context.Context, string) (P, error), close func(P), backend func(P) dlock.Backend) func(t *testing.T) dlock.Backend {
	return func(t *testing.T) dlock.Backend {
		p, err := open(context.Background(), pgSrv.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { close(p) })
		return backend(p)
	}
}

// Backends returns a Backend on the redis-server and one on the PostgreSQL
// server started by Main.
func Backends() []Backend {
	return []Backend{
		{"redis", func(t *testing.T) dlock.Backend {
			rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Addr()})
			t.Cleanup(func() { rdb.Close() })
			return redislock.New(rdb)
		}},
		{"postgres", newPostgres},
	}
}

// Client returns a Client on a new backend of be, closed when the test
// ends; it fails the test if the options are invalid.
func (be Backend) Client(t *testing.T, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c := dlock.New(be.New(t), opts...)
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
