package redislock_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/locktest/testmain"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// Servers shared by the tests of this package, started once by TestMain.
var (
	srv  *testserver.Redis // paused and resumed by the conformance suite
	srv2 *testserver.Redis // killed and restarted (no persistence)
)

// quietLogger drops go-redis' log lines (dial failures the tests cause
// on purpose).
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	if os.Getenv(helperEnv) != "" {
		// Re-executed by a test as a separate waiter process.
		os.Exit(helperMain())
	}
	servers, err := testserver.StartRedisN(2, testserver.RedisOptions{})
	if err != nil {
		testmain.Fail("redislock", err)
	}
	srv, srv2 = servers[0], servers[1]
	testmain.Run(m, "redislock", func() error { return testserver.StopAll(srv, srv2) })
}

// newRDB returns a go-redis client for addr, closed when the test ends.
func newRDB(t testing.TB, addr string, edit ...func(*redis.Options)) *redis.Client {
	t.Helper()
	opt := &redis.Options{Addr: addr}
	for _, e := range edit {
		e(opt)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// newBackend returns a Backend on rdb, closed when the test ends.
func newBackend(t testing.TB, rdb redislock.Client, opts ...redislock.Option) *redislock.Backend {
	t.Helper()
	b := redislock.New(rdb, opts...)
	if err := b.Err(); err != nil {
		t.Fatalf("redislock.New: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Backend.Close: %v", err)
		}
	})
	return b
}

// newClient returns a dlock.Client on a new Backend on rdb, closed when
// the test ends (before the Backend).
func newClient(t testing.TB, rdb redislock.Client, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c := dlock.New(redislock.New(rdb), opts...)
	if err := c.Err(); err != nil {
		t.Fatalf("dlock.New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Client.Close: %v", err)
		}
	})
	return c
}

// The shared test kit's helpers, under this package's names.
var (
	key     = locktest.Key
	ctxT    = locktest.Ctx
	waitFor = locktest.WaitFor
)

// lockValue is a lock's value on the server (see lib.lua).
type lockValue struct {
	Fence uint64
	Count int
	Flags string
	Ahead int
	Token string
}

// readLock reads and parses the lock of key; ok is false when there is
// none.
func readLock(t testing.TB, rdb redis.Cmdable, b *redislock.Backend, key string) (v lockValue, ok bool) {
	t.Helper()
	s, err := rdb.Get(context.Background(), b.LockName(key)).Result()
	if err == redis.Nil {
		return v, false
	}
	if err != nil {
		t.Fatalf("GET of the lock: %v", err)
	}
	parts := strings.SplitN(s, ":", 5)
	if len(parts) != 5 {
		t.Fatalf("lock value %q: want FENCE:COUNT:FLAGS:AHEAD:TOKEN", s)
	}
	fence, err1 := strconv.ParseUint(parts[0], 10, 64)
	count, err2 := strconv.Atoi(parts[1])
	ahead, err3 := strconv.Atoi(parts[3])
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatalf("lock value %q: want FENCE:COUNT:FLAGS:AHEAD:TOKEN", s)
	}
	return lockValue{fence, count, parts[2], ahead, parts[4]}, true
}
