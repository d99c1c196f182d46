package gocronlock_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
	"github.com/dlock-go/dlock/redislock"
)

// The servers the tests run on, started once by TestMain.
var (
	redisSrv *testserver.Redis
	pgSrv    *testserver.Postgres
)

type testMain struct{ m *testing.M }

// Run stops the servers after the tests and before goleak looks for
// leaked goroutines.
func (tm testMain) Run() int {
	code := tm.m.Run()
	if err := testserver.StopAll[interface{ Stop() error }](redisSrv, pgSrv); err != nil {
		fmt.Fprintln(os.Stderr, "gocronlock tests:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func TestMain(m *testing.M) {
	var err error
	if redisSrv, err = testserver.StartRedis(testserver.RedisOptions{}); err == nil {
		pgSrv, err = testserver.StartPostgres(testserver.PostgresOptions{})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gocronlock tests:", err)
		redisSrv.Stop()
		os.Exit(1)
	}
	goleak.VerifyTestMain(testMain{m})
}

// backends are the servers every framework test runs on: each func
// returns a new connection and backend, as another process would have.
var backends = []struct {
	name string
	new  func(t *testing.T) dlock.Backend
}{
	{"redis", func(t *testing.T) dlock.Backend {
		rdb := redis.NewClient(&redis.Options{Addr: redisSrv.Addr()})
		t.Cleanup(func() { rdb.Close() })
		return redislock.New(rdb)
	}},
	{"postgres", func(t *testing.T) dlock.Backend {
		pool, err := pgxpool.New(context.Background(), pgSrv.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pglock.New(pool)
	}},
}

// newClient returns a Client on a new backend, closed when the test ends.
func newClient(t *testing.T, nb func(t *testing.T) dlock.Backend, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c := dlock.New(nb(t), opts...)
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
