package etcdlock_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// srv is the single-member etcd shared by the tests of this package,
// started once by TestMain; the conformance suite pauses and resumes it.
var srv *testserver.Etcd

// A holder process (see TestHolderProcess) starts no server of its own.
func TestMain(m *testing.M) {
	locktest.ServerMain(m, "etcdlock", &srv, func() (*testserver.Etcd, error) {
		return testserver.StartEtcd(testserver.EtcdOptions{})
	})
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

// entries returns the number of etcd keys (holder and queued waiters)
// under the lock key's directory, for keys without "/" or "%".
func entries(t testing.TB, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(locktest.Ctx(t, 5*time.Second), etcdlock.DefaultPrefix+key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count entries of %q: %v", key, err)
	}
	return resp.Count
}
