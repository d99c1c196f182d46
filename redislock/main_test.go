package redislock_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	return locktest.Closing(t, redislock.New(rdb, opts...))
}

// newClient returns a dlock.Client on a new Backend on rdb, closed when
// the test ends (with its Backend).
func newClient(t testing.TB, rdb redislock.Client, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	return locktest.Closing(t, dlock.New(redislock.New(rdb), opts...))
}

// dlockClient returns a dlock.Client on a new Backend with opts on rdb,
// closed when the test ends.
func dlockClient(t testing.TB, rdb redislock.Client, opts ...redislock.Option) *dlock.Client {
	t.Helper()
	b := redislock.New(rdb, opts...)
	if err := b.Err(); err != nil {
		t.Fatalf("redislock.New: %v", err)
	}
	return locktest.Closing(t, dlock.New(b))
}

// peer returns a Client with opts on a new Backend and connection of its
// own to srv (as another process would have), closed when the test ends.
func peer(t *testing.T, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	return newClient(t, newRDB(t, srv.Addr()), opts...)
}

// peerWith is peer with Backend options.
func peerWith(t *testing.T, opts ...redislock.Option) *dlock.Client {
	t.Helper()
	return dlockClient(t, newRDB(t, srv.Addr()), opts...)
}

// The shared test kit's helpers, under this package's names.
var (
	key         = locktest.Key
	ctxT        = locktest.Ctx
	waitFor     = locktest.WaitFor
	mustAcquire = locktest.MustAcquire
)

// release releases each lease with ctx, failing the test on an error.
func release(t testing.TB, ctx context.Context, ls ...*dlock.Lease) {
	t.Helper()
	for _, l := range ls {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release of %q: %v", l.Key(), err)
		}
	}
}

// onSrv returns a connection to srv, a Backend with opts on it, both
// closed when the test ends, and a context that ends after 30s.
func onSrv(t testing.TB, opts ...redislock.Option) (*redis.Client, *redislock.Backend, context.Context) {
	t.Helper()
	rdb := newRDB(t, srv.Addr())
	return rdb, newBackend(t, rdb, opts...), ctxT(t, 30*time.Second)
}

// holding returns r with the fence of its grant by b, failing the test
// if r is not granted.
func holding(t testing.TB, b *redislock.Backend, r dlock.Request) dlock.Request {
	t.Helper()
	r.Fence = mustGrant(t, b, r).Fence
	return r
}

// mustRelease releases each request's hold through b, failing the test
// on an error.
func mustRelease(t testing.TB, b *redislock.Backend, rs ...dlock.Request) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	for _, r := range rs {
		if err := b.Release(ctx, r); err != nil {
			t.Fatalf("Release %+v: %v", r, err)
		}
	}
}

// noLock fails the test if the lock of one of keys exists on the server
// behind rdb; what says when, in the message.
func noLock(t testing.TB, rdb redis.Cmdable, b *redislock.Backend, what string, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if n := rdb.Exists(context.Background(), b.LockName(k)).Val(); n != 0 {
			t.Fatalf("%s: the lock of %q exists, want none", what, k)
		}
	}
}

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

// hookFunc is a go-redis hook that calls itself with the commands of each
// round trip before it is sent (pipe tells a pipeline from a single
// command); a non-nil error fails the round trip without sending it.
type hookFunc func(cmds []redis.Cmder, pipe bool) error

// DialHook returns next.
func (f hookFunc) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook returns next, preceded by f.
func (f hookFunc) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := f([]redis.Cmder{cmd}, false); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook returns next, preceded by f.
func (f hookFunc) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := f(cmds, true); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

// countHook returns a hook that adds to n the commands a go-redis client
// sends (each command of a pipeline counts).
func countHook(n *atomic.Int64) hookFunc {
	return func(cmds []redis.Cmder, _ bool) error {
		n.Add(int64(len(cmds)))
		return nil
	}
}

// cmdCalls returns how many of the named commands ("publish", ...) the
// server behind rdb has run, or how many commands at all without names
// (INFO commandstats: the redis.call of scripts included).
func cmdCalls(t testing.TB, rdb redis.Cmdable, names ...string) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	return locktest.CommandCalls(info, names...)
}

// notified fails the test unless ch delivers within 5s; what names the
// notification in the message.
func notified(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: not notified within 5s", what)
	}
}

// tripHook records the round trips of a go-redis client (its add is the
// hook): one per pipeline, one per single command.
type tripHook struct {
	mu     sync.Mutex
	trips  []trip
	record bool
}

type trip struct {
	at   time.Time
	cmds int
	pipe bool
}

// add records the round trip of cmds (a hookFunc).
func (h *tripHook) add(cmds []redis.Cmder, pipe bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.record {
		h.trips = append(h.trips, trip{time.Now(), len(cmds), pipe})
	}
	return nil
}

// count returns the number of round trips recorded since start.
func (h *tripHook) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.trips)
}

func (h *tripHook) start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.trips, h.record = nil, true
}

func (h *tripHook) stop() []trip {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.record = false
	return h.trips
}
