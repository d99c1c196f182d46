package etcdlock_test

import (
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// fastReconnectClient is newClient with a gRPC reconnection backoff capped
// at 500 ms (default: 1 s growing ×1.6 up to 120 s), so that how soon a
// client is connected again after a server restart does not depend on how
// long the server was down, only on etcdlock.
func fastReconnectClient(t testing.TB, eps []string, opts ...dlock.Option) (*dlock.Client, *etcdlock.Backend) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		t.Fatalf("clientv3.New(%v): %v", eps, err)
	}
	t.Cleanup(func() { cli.Close() })
	b := etcdlock.New(cli)
	c := dlock.New(b, opts...)
	if err := c.Err(); err != nil {
		t.Fatalf("dlock.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, b
}

// TestFailedReleaseDoesNotStallQueue: a Release fails because the server
// is down, so the entry stays on the Backend's shared lease as an orphan;
// the server stays down until the Backend's first background attempt to
// delete it has failed, out of its time (5 s). Meanwhile the same
// Backend and another one queue on the lock. The same Backend's Wait keeps
// the shared lease alive, so unless the Backend deletes its orphan once the
// server is back, the orphan heads the queue for ever (before the fix: until
// the waits' deadline). Both waiters must be granted within
// grantBound of the server answering again.
//
// "Back" is when Restart returns, the server having answered a health
// check (clients may reconnect a little earlier). grantBound: the background removal retries at most every 1 s, the
// clients reconnect within 0.5 s (fastReconnectClient), then a read and a
// delete, the waiter's watch event and a grant: about 1.5 s plus a few
// round trips; 4 s leaves room for a loaded machine and is far below the
// waits' 25 s deadline. The second waiter is granted when the first one
// releases, within the same bound.
func TestFailedReleaseDoesNotStallQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("keeps a server down for over 5 s")
	}
	const (
		grantBound = 4 * time.Second
		lockTTL    = 20 * time.Second // > the outage: the shared lease survives it
	)
	e, err := testserver.StartEtcd(testserver.EtcdOptions{})
	if err != nil {
		t.Fatalf("StartEtcd: %v", err)
	}
	t.Cleanup(func() { e.Stop() })
	eps := e.Endpoints()
	key := locktest.Key(t)
	a, ab := fastReconnectClient(t, eps, dlock.WithTTL(lockTTL))
	other, _ := fastReconnectClient(t, eps, dlock.WithTTL(lockTTL))

	l := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), a, key)
	if err := e.Kill(); err != nil {
		t.Fatalf("kill etcd: %v", err)
	}
	killed := time.Now()
	if err := l.Release(locktest.Ctx(t, 300*time.Millisecond)); err == nil {
		t.Fatal("Release with the server killed: got nil error, want a failure")
	}

	// Both queue while the server is down (their requests wait for it).
	type result struct {
		who string
		l   *dlock.Lease
		err error
		at  time.Time
	}
	res := make(chan result, 2)
	wctx := locktest.Ctx(t, 25*time.Second)
	for who, c := range map[string]*dlock.Client{"same Backend": a, "other Backend": other} {
		go func() {
			l, err := c.Acquire(wctx, key)
			// A call in flight when the connection broke fails
			// (Unavailable): what this test measures is the wait after
			// that, so such a failure waits again.
			for i := 0; err != nil && strings.Contains(err.Error(), "code = Unavailable") && i < 3; i++ {
				l, err = c.Acquire(wctx, key)
			}
			res <- result{who, l, err, time.Now()}
		}()
	}
	locktest.WaitFor(t, 15*time.Second, "the first background removal attempt out of time", func() bool { return etcdlock.SweepsExpired(ab) > 0 })
	restarting := time.Now()
	if err := e.Restart(); err != nil { // returns once the server is healthy
		t.Fatalf("restart etcd: %v", err)
	}
	back := time.Now()
	t.Logf("server killed for %v, then %v to restart and answer a health check", restarting.Sub(killed), back.Sub(restarting))
	var last uint64
	for range 2 {
		r := <-res
		if r.err != nil {
			t.Fatalf("%s: Acquire: got %v after %v of the server back, want a grant", r.who, r.err, r.at.Sub(back))
		}
		took := r.at.Sub(back)
		t.Logf("%s granted fence %d, %v after the server was back (negative: before the health check returned)", r.who, r.l.Fence(), took)
		if took > grantBound {
			t.Errorf("%s granted %v after the server was back, want within %v", r.who, took, grantBound)
		}
		if r.l.Fence() <= max(last, l.Fence()) {
			t.Errorf("%s fence: got %d, want > %d", r.who, r.l.Fence(), max(last, l.Fence()))
		}
		last = r.l.Fence()
		if err := r.l.Release(locktest.Ctx(t, 5*time.Second)); err != nil {
			t.Errorf("%s: Release: %v", r.who, err)
		}
	}
}
