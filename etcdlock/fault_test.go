package etcdlock_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// holderEndpoints names the holder process's etcd endpoints, joined with
// ",", in its environment.
const holderEndpoints = "ETCDLOCK_TEST_ENDPOINTS"

// TestHolderProcess is not a test: it runs only in a holder process
// started by locktest.StartHolder, where it takes the hold asked for with
// TTL ttl and keeps it (renewed by the watchdog) until it is killed.
func TestHolderProcess(t *testing.T) {
	if !locktest.InHolderProcess() {
		t.Skip("holder process only")
	}
	cli := newCli(t, strings.Split(os.Getenv(holderEndpoints), ","))
	locktest.RunHolder(t, dlock.New(etcdlock.New(cli), dlock.WithTTL(ttl)))
}

// killHolder runs locktest.KillHolder for a hold of kind on the shared
// server, taken by a process with TTL ttl: the waiter (TTL 10s, as the
// Client rejects a queue wait longer than the waiter's TTL) must be
// granted within ttl + 1s of the kill.
func killHolder(t *testing.T, kind dlock.Kind, waitOpts ...dlock.Option) {
	key := locktest.Key(t)
	cli := newCli(t, srv.Endpoints())
	c, _ := newClient(t, srv.Endpoints(), dlock.WithTTL(10*time.Second))
	locktest.KillHolder(t, locktest.HolderKill{
		Key:      key,
		Kind:     kind,
		Env:      []string{holderEndpoints + "=" + strings.Join(srv.Endpoints(), ",")},
		Bound:    ttl,
		Waiter:   c,
		WaitOpts: waitOpts,
		Queued:   func(t testing.TB) { queued(t, cli, key, 2) },
		Gone: func() bool {
			resp, err := cli.Get(context.Background(), etcdlock.DefaultPrefix+key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && resp.Count < 2
		},
	})
}

// TestHolderKilled: the holder is a process killed with SIGKILL (no
// release, no revocation); the next waiter must get the lock within a
// second of the later of the lease TTL after the kill and etcd's removal
// of the holder's entry.
func TestHolderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a holder process")
	}
	killHolder(t, dlock.KindLock)
}

// TestLeaderKilledDuringHold: in a 3-member cluster the leader is killed
// while a lock is held and another client keeps trying to take it. The
// holder's lease must survive, or be reported lost (Done/Err, or its
// conservative deadline Expires passed) before the other client gets the
// lock: never silently double-held.
func TestLeaderKilledDuringHold(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd cluster")
	}
	cluster, err := testserver.StartEtcdCluster(3)
	if err != nil {
		t.Fatalf("StartEtcdCluster(3): %v", err)
	}
	t.Cleanup(func() { cluster.Stop() })
	const holdTTL = 4 * time.Second
	eps := cluster.Endpoints()
	key := locktest.Key(t)
	a, _ := newClient(t, eps, dlock.WithTTL(holdTTL))
	held := locktest.MustAcquire(t, locktest.Ctx(t, 10*time.Second), a, key)
	leader, err := cluster.Leader()
	if err != nil {
		t.Fatal(err)
	}

	// The contender: Acquire in a loop, tolerating errors during the
	// election, until it gets the lock or the test ends.
	b, _ := newClient(t, eps, dlock.WithTTL(holdTTL))
	ctx, cancel := context.WithTimeout(context.Background(), 4*holdTTL)
	defer cancel()
	var (
		attempts  atomic.Int32
		releasing atomic.Bool // the holder is releasing: its Err may lag the server
	)
	type result struct {
		l          *dlock.Lease
		holderErr  error
		pastExpiry bool
		releasing  bool
	}
	res := make(chan result, 1)
	go func() {
		for ctx.Err() == nil {
			attempts.Add(1)
			actx, acancel := context.WithTimeout(ctx, holdTTL)
			l, err := b.Acquire(actx, key)
			acancel()
			if err != nil {
				continue
			}
			// At this instant the first holder must know it may have lost.
			res <- result{l: l, holderErr: held.Err(), pastExpiry: !time.Now().Before(held.Expires()), releasing: releasing.Load()}
			return
		}
		res <- result{}
	}()
	locktest.WaitFor(t, 10*time.Second, "contender queued", func() bool { return attempts.Load() > 0 })
	if err := leader.Kill(); err != nil {
		t.Fatalf("kill leader %s: %v", leader.Name(), err)
	}
	killed := time.Now()
	t.Logf("killed leader %s", leader.Name())

	// Hold for 3 TTLs after the kill, unless lost first.
	select {
	case <-held.Done():
		t.Logf("holder reported lost %v after the leader was killed: %v", time.Since(killed), held.Err())
	case <-time.After(3 * holdTTL):
		t.Logf("holder's lease survived the leader kill (%v held since)", time.Since(killed))
	}
	if held.Err() == nil {
		// Survived: the contender must not have the lock.
		select {
		case r := <-res:
			if r.l != nil {
				t.Fatalf("contender acquired while the holder still holds (Err nil): double hold")
			}
		default:
		}
		releasing.Store(true)
		if err := held.Release(locktest.Ctx(t, 10*time.Second)); err != nil {
			t.Fatalf("Release after the leader kill: %v", err)
		}
	} else if !errors.Is(held.Err(), dlock.ErrLost) {
		t.Fatalf("holder Err: got %v, want ErrLost", held.Err())
	}
	select {
	case r := <-res:
		if r.l == nil {
			t.Fatalf("contender never acquired after the holder ended (%d attempts)", attempts.Load())
		}
		if r.holderErr == nil && !r.pastExpiry && !r.releasing {
			t.Fatal("contender acquired while the holder believed it held the lock (Err nil, before Expires): silent double hold")
		}
		t.Logf("contender acquired fence %d > %d after %d attempts", r.l.Fence(), held.Fence(), attempts.Load())
		if r.l.Fence() <= held.Fence() {
			t.Errorf("contender fence: got %d, want > %d", r.l.Fence(), held.Fence())
		}
		r.l.Release(context.Background())
	case <-time.After(4 * holdTTL):
		t.Fatal("contender did not acquire after the holder ended")
	}
}
