package redlock_test

import (
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/locktest/testmain"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redlock"
)

// nodes are five independent redis-servers (no persistence) shared by the
// tests of this package, started once by TestMain. Tests that pause, kill
// or restart them bring them back (see fault) before they end.
var nodes []*testserver.Redis

// quietLogger drops go-redis' log lines (dial failures the tests cause on
// purpose).
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	var err error
	if nodes, err = testserver.StartRedisN(5, testserver.RedisOptions{}); err != nil {
		testmain.Fail("redlock", err)
	}
	// go-redis starts a dial prober after PoolSize failed dials in a row
	// (the killed-node tests make them); it sleeps 1s between probes and
	// notices its pool was closed only then, later than goleak waits.
	testmain.Run(m, "redlock", func() error { return testserver.StopAll(nodes...) },
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// newClients returns one new go-redis client per node, closed when the
// test ends.
func newClients(t testing.TB, edit ...func(*redis.Options)) []*redis.Client {
	t.Helper()
	rdbs := make([]*redis.Client, len(nodes))
	for i, n := range nodes {
		opt := &redis.Options{Addr: n.Addr()}
		for _, e := range edit {
			e(opt)
		}
		rdbs[i] = redis.NewClient(opt)
		rdb := rdbs[i]
		t.Cleanup(func() { rdb.Close() })
	}
	return rdbs
}

// newBackend returns a Backend over new clients of the five nodes, closed
// when the test ends.
func newBackend(t testing.TB, opts ...redlock.Option) *redlock.Backend {
	t.Helper()
	return locktest.Closing(t, redlock.NewWithOptions(newClients(t), opts...))
}

// newClient returns a dlock.Client on a new Backend (newBackend), closed
// when the test ends.
func newClient(t testing.TB, bopts []redlock.Option, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	return locktest.Closing(t, dlock.New(newBackend(t, bopts...), opts...))
}

// A fault takes some nodes out: Pause (SIGSTOP: connections stay open,
// nothing is answered) or Kill (connections refused; Restart brings the
// node back empty).
type fault string

const (
	pause fault = "Pause"
	kill  fault = "Kill"
)

// act takes node i out as f does or, with back, brings it back.
func (f fault) act(i int, back bool) error {
	n := nodes[i]
	switch {
	case f == pause && back:
		return n.Resume()
	case f == pause:
		return n.Pause()
	case back:
		return n.Restart()
	}
	return n.Kill()
}

// apply takes the nodes with the given indexes out and returns a function
// that brings them back (also registered with t.Cleanup; calling it twice
// is harmless).
func (f fault) apply(t testing.TB, idx ...int) (restore func()) {
	t.Helper()
	for _, i := range idx {
		if err := f.act(i, false); err != nil {
			t.Fatalf("%s node %d: %v", f, i, err)
		}
	}
	done := false
	restore = func() {
		t.Helper()
		if done {
			return
		}
		done = true
		for _, i := range idx {
			if err := f.act(i, true); err != nil {
				t.Errorf("restore node %d after %s: %v", i, f, err)
			}
		}
	}
	t.Cleanup(restore)
	return restore
}

// nodeErrs returns the *dlock.NodeError values joined in err.
func nodeErrs(err error) []*dlock.NodeError {
	var out []*dlock.NodeError
	var walk func(error)
	walk = func(err error) {
		if ne, ok := err.(*dlock.NodeError); ok {
			out = append(out, ne)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// req returns a backend request for key with a fresh token.
func req(key string, ttl time.Duration) dlock.Request {
	return dlock.Request{Key: key, Token: rand.Text(), TTL: ttl}
}

// tombstone returns the value of a free lock whose next fence must exceed
// fence (redislock's layout, as a node would leave it behind a fence that
// ran ahead of its clock).
func tombstone(fence uint64) string {
	return strconv.FormatUint(fence, 10) + ":0::0:"
}

// parseU parses a decimal uint64, 0 if it is not one.
func parseU(s string) uint64 {
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}
