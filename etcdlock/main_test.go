package etcdlock_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// srv is the single-member etcd shared by the tests of this package,
// started once by TestMain; the conformance suite pauses and resumes it.
var srv *testserver.Etcd

// testMain stops the server after the tests and before goleak looks for
// leaked goroutines (the testserver package keeps one while servers run).
type testMain struct{ m *testing.M }

func (tm testMain) Run() int {
	code := tm.m.Run()
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "etcdlock tests: stop etcd:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		// A helper process (see TestHelperProcess): no server of its own.
		os.Exit(m.Run())
	}
	var err error
	srv, err = testserver.StartEtcd(testserver.EtcdOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdlock tests:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(testMain{m})
}

// ttl is the lease TTL of most tests: etcd's minimum.
const ttl = etcdlock.MinTTL

// newCli returns an etcd client for eps, closed when the test ends.
func newCli(t testing.TB, eps []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("clientv3.New(%v): %v", eps, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// newClient returns a dlock Client on a new etcd connection and Backend,
// like another process would have; both are closed when the test ends.
func newClient(t testing.TB, eps []string, opts ...dlock.Option) (*dlock.Client, *etcdlock.Backend) {
	t.Helper()
	b := etcdlock.New(newCli(t, eps))
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

// waitFor polls cond every millisecond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// entries returns the number of etcd keys (holder and queued waiters)
// under the lock key's directory, for keys without "/" or "%".
func entries(t testing.TB, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(ctxT(t, 5*time.Second), etcdlock.DefaultPrefix+key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count entries of %q: %v", key, err)
	}
	return resp.Count
}
