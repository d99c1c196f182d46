package pglock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/pglock"
)

var _ interface {
	dlock.Backend
	dlock.BatchRefresher
	dlock.Notifier
	dlock.Inspector
	dlock.ForceReleaser
	dlock.TTLFloor
} = (*pglock.Backend)(nil)

// exec runs sql as the superuser.
func exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := newPool(t).Exec(locktest.Ctx(t, 10*time.Second), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// poolAs returns a pool on the test server as role.
func poolAs(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	return openPool(t, strings.Replace(srv.DSN(), "//postgres@", "//"+role+"@", 1))
}

func tryAcquire(t *testing.T, b *pglock.Backend, r dlock.Request) (dlock.Grant, error) {
	t.Helper()
	return b.TryAcquire(locktest.Ctx(t, 10*time.Second), r)
}

// A schema of the same name that pglock did not create, or whose tables
// changed shape, is refused with ErrWrongType and left untouched.
func TestSchemaNotOurs(t *testing.T) {
	exec(t, "CREATE SCHEMA app_foreign; CREATE TABLE app_foreign.locks (key text)")
	b := newBackend(t, pglock.WithSchema("app_foreign"))
	_, err := tryAcquire(t, b, dlock.Request{Key: "k", Token: "t", TTL: time.Second})
	if !errors.Is(err, dlock.ErrWrongType) || !strings.Contains(err.Error(), "not created by pglock") {
		t.Fatalf("TryAcquire on a foreign schema: got %v, want ErrWrongType naming the schema", err)
	}

	b2 := newBackend(t, pglock.WithSchema("altered"))
	if _, err := tryAcquire(t, b2, dlock.Request{Key: "k", Token: "t", TTL: time.Second}); err != nil {
		t.Fatalf("TryAcquire on a new schema: %v", err)
	}
	exec(t, "ALTER TABLE altered.locks ADD COLUMN note text")
	b3 := newBackend(t, pglock.WithSchema("altered"))
	_, err = tryAcquire(t, b3, dlock.Request{Key: "k2", Token: "t", TTL: time.Second})
	if !errors.Is(err, dlock.ErrWrongType) || !strings.Contains(err.Error(), "note text") {
		t.Fatalf("TryAcquire on an altered schema: got %v, want ErrWrongType showing the extra column", err)
	}
}

// A schema made by the first release (no wake_until, no wake function) is
// upgraded in place, and a lock held in it stays held.
func TestSchemaUpgrade(t *testing.T) {
	b := newBackend(t, pglock.WithSchema("old_release"))
	g := granted(t, locktest.Ctx(t, 10*time.Second), b, dlock.Request{Key: "k", Token: "t", TTL: time.Minute})
	exec(t, "ALTER TABLE old_release.locks DROP COLUMN wake_until; DROP FUNCTION old_release.wake(text)")
	b2 := newBackend(t, pglock.WithSchema("old_release"))
	g2, err := tryAcquire(t, b2, dlock.Request{Key: "k", Token: "t2", TTL: time.Second})
	if err != nil {
		t.Fatalf("TryAcquire on a first-release schema: %v", err)
	}
	if g2.OK {
		t.Fatal("the lock held before the upgrade was granted to another token")
	}
	if g3, err := tryAcquire(t, b2, dlock.Request{Key: "k3", Token: "t3", TTL: time.Second}); err != nil || !g3.OK || g3.Fence <= g.Fence {
		t.Fatalf("TryAcquire of a free key after the upgrade: %+v, %v (want a fence above %d)", g3, err, g.Fence)
	}
}

// A role that may neither create the schema nor use an existing one gets
// an error saying so.
func TestPrivileges(t *testing.T) {
	exec(t, "CREATE ROLE weak LOGIN")
	b := locktest.Closing(t, pglock.New(poolAs(t, "weak"), pglock.WithSchema("weak_new")))
	_, err := tryAcquire(t, b, dlock.Request{Key: "k", Token: "t", TTL: time.Second})
	if err == nil || !strings.Contains(err.Error(), "may not create schema") {
		t.Fatalf("TryAcquire by a role without CREATE: got %v, want an error about creating the schema", err)
	}
	own := newBackend(t, pglock.WithSchema("weak_existing"))
	if _, err := tryAcquire(t, own, dlock.Request{Key: "k", Token: "t", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	b2 := locktest.Closing(t, pglock.New(poolAs(t, "weak"), pglock.WithSchema("weak_existing")))
	_, err = tryAcquire(t, b2, dlock.Request{Key: "k", Token: "t", TTL: time.Second})
	if err == nil || !strings.Contains(err.Error(), `role "weak" lacks privileges`) {
		t.Fatalf("TryAcquire by a role without privileges: got %v, want an error naming the role", err)
	}
	exec(t, "GRANT USAGE ON SCHEMA weak_existing TO weak; GRANT USAGE ON SEQUENCE weak_existing.fence TO weak; "+
		"GRANT SELECT, INSERT, UPDATE, DELETE ON weak_existing.locks, weak_existing.waiters TO weak")
	b3 := locktest.Closing(t, pglock.New(poolAs(t, "weak"), pglock.WithSchema("weak_existing")))
	if _, err := tryAcquire(t, b3, dlock.Request{Key: "k2", Token: "t", TTL: time.Second}); err != nil {
		t.Fatalf("TryAcquire after the grants: %v", err)
	}
}

// Deadlines never move back; refresh and release compare token and fence;
// a non-reentrant attempt by the holder's token is refused.
func TestLeaseModel(t *testing.T) {
	b := newBackend(t)
	ctx := locktest.Ctx(t, 10*time.Second)
	key := locktest.Key(t)
	r := dlock.Request{Key: key, Token: "a", TTL: 5 * time.Second, Reentrant: true}
	g := granted(t, ctx, b, r)
	r.Fence = g.Fence
	remaining := func() time.Duration {
		info, err := b.Inspect(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return info.TTL
	}
	// A refresh or a re-entry with a shorter TTL does not shorten the lock.
	short := r
	short.TTL = 100 * time.Millisecond
	if err := b.Refresh(ctx, short); err != nil {
		t.Fatal(err)
	}
	if got := remaining(); got < 4*time.Second {
		t.Fatalf("TTL after Refresh(100ms): got %v, want about 5s", got)
	}
	short.Fence = 0
	if g2, err := b.TryAcquire(ctx, short); err != nil || !g2.OK || g2.Count != 2 || g2.Fence != g.Fence {
		t.Fatalf("reentrant TryAcquire: got %+v, %v; want count 2 and fence %d", g2, err, g.Fence)
	}
	if got := remaining(); got < 4*time.Second {
		t.Fatalf("TTL after a 100ms re-entry: got %v, want about 5s", got)
	}
	// Another fence or token: not held, nothing changes.
	stale := r
	stale.Fence = g.Fence + 1
	for op, call := range map[string]func(context.Context, dlock.Request) error{"Release": b.Release, "Refresh": b.Refresh} {
		if err := call(ctx, stale); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("%s with a stale fence: got %v, want ErrNotHeld", op, err)
		}
	}
	nr := r
	nr.Reentrant, nr.Fence = false, 0
	if g3, err := b.TryAcquire(ctx, nr); err != nil || g3.OK {
		t.Fatalf("non-reentrant TryAcquire by the holder: got %+v, %v; want not granted", g3, err)
	}
	// RefreshMany: one held, one stale, one duplicate key.
	errs := b.RefreshMany(ctx, []dlock.Request{r, stale, r})
	if errs[0] != nil || !errors.Is(errs[1], dlock.ErrNotHeld) || errs[2] != nil {
		t.Fatalf("RefreshMany: got %v, want [nil ErrNotHeld nil]", errs)
	}
	info, _ := b.Inspect(ctx, key)
	if !info.Held || info.Count != 2 || info.Owner != "a" || info.Fence != g.Fence {
		t.Fatalf("Inspect: got %+v, want held by a, count 2, fence %d", info, g.Fence)
	}
	for i := 0; i < 2; i++ {
		if err := b.Release(ctx, r); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
	}
	if err := b.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("third Release: got %v, want ErrNotHeld", err)
	}
	// A new grant gets a larger fence; ForceRelease removes it.
	g4, err := b.TryAcquire(ctx, dlock.Request{Key: key, Token: "b", TTL: time.Second})
	if err != nil || !g4.OK || g4.Fence <= g.Fence {
		t.Fatalf("TryAcquire after release: got %+v, %v; want a fence above %d", g4, err, g.Fence)
	}
	fi, err := b.ForceRelease(ctx, key)
	if err != nil || !fi.Held || fi.Owner != "b" || fi.Fence != g4.Fence {
		t.Fatalf("ForceRelease: got %+v, %v; want b's grant", fi, err)
	}
	if info, _ := b.Inspect(ctx, key); info.Held {
		t.Fatalf("Inspect after ForceRelease: got %+v, want free", info)
	}
	if _, err := b.TryAcquire(ctx, dlock.Request{Key: key, Token: "c", TTL: pglock.MinTTL / 2}); !errors.Is(err, dlock.ErrInvalidTTL) {
		t.Fatalf("TryAcquire below MinTTL: got %v, want ErrInvalidTTL", err)
	}
}

// attempts counts a Client's acquisition attempts (server round trips).
type attempts struct{ n atomic.Int64 }

func (a *attempts) Observe(ctx context.Context, e dlock.Event) context.Context {
	if e.Kind == dlock.EventAttempt {
		a.n.Add(1)
	}
	return ctx
}

// A release wakes one waiter, the oldest: with n waiters queued, n
// hand-overs make n attempts after the initial two each (try, then retry
// after subscribing), and the lock goes round in arrival order.
func TestOneWaiterWokenPerRelease(t *testing.T) {
	const n = 4
	key := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	holderC, _ := newClient(t, dlock.WithTTL(30*time.Second))
	holder := locktest.MustAcquire(t, ctx, holderC, key)
	var (
		counters [n]attempts
		order    []int
		mu       sync.Mutex
		wg       sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		c, b := newClient(t, dlock.WithTTL(30*time.Second), dlock.WithWait(dlock.Constant(time.Minute)), dlock.WithObserver(&counters[i]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Acquire(ctx, key)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := l.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		// Queue them in order: wait until this one has subscribed and
		// retried.
		locktest.WaitFor(t, 30*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool {
			info, err := b.Inspect(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return info.Waiters == i+1 && counters[i].n.Load() == 2
		})
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range counters {
		if got := counters[i].n.Load(); got != 3 {
			t.Errorf("waiter %d attempts: got %d, want 3 (woken once)", i, got)
		}
	}
	for i, w := range order {
		if w != i {
			t.Fatalf("acquisition order: got %v, want arrival order", order)
		}
	}
}

// Guard holds off a takeover until the guarded transaction ends, and
// refuses a lease whose lock was taken over.
func TestGuard(t *testing.T) {
	key := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	pool := newPool(t)
	b := pglock.New(pool)
	c := dlock.New(b, dlock.WithTTL(500*time.Millisecond), dlock.WithAutoRenew(false))
	defer c.Close()
	// A first grant dials and prepares; under load that alone can take
	// longer than the short TTL below.
	warm, err := c.Acquire(ctx, key+".warm", dlock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	old := locktest.MustAcquire(t, ctx, c, key)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Guard(ctx, tx, old); err != nil {
		t.Fatalf("Guard of a held lease: %v", err)
	}
	<-old.Done() // expired on the client side, and soon on the server
	var txPID uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&txPID); err != nil {
		t.Fatal(err)
	}
	other, _ := newClient(t)
	var committed atomic.Bool
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := other.Acquire(ctx, key)
		if err != nil {
			t.Errorf("takeover: %v", err)
		}
		if !committed.Load() {
			t.Errorf("takeover granted while the guarded transaction was open")
		}
		got <- l
	}()
	// Commit once the server's deadline has passed too and the takeover
	// waits for the guarded transaction.
	admin := newPool(t)
	locktest.WaitFor(t, 30*time.Second, "a takeover attempt blocked by the guarded transaction after the deadline", func() bool {
		var blocked int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE $1::int = ANY(pg_blocking_pids(pid)) AND NOT EXISTS (SELECT 1 FROM dlock.locks WHERE key = $2 AND expires > now())`,
			int64(txPID), key).Scan(&blocked)
		if err != nil {
			t.Fatal(err)
		}
		return blocked > 0
	})
	committed.Store(true)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		return
	}
	defer l.Release(ctx)
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	if err := b.Guard(ctx, tx2, old); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Guard of a taken-over lease: got %v, want ErrLost", err)
	}
}

// A server restart keeps the locks (the table is durable), the pools
// replace their broken connections within a call, and the listener
// reconnects: a waiter that subscribed before the restart is woken by a
// release after it.
func TestRestart(t *testing.T) {
	key := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	holderC, _ := newClient(t, dlock.WithTTL(20*time.Second))
	holder := locktest.MustAcquire(t, ctx, holderC, key)
	// The waiter must be parked in its wait when the server goes down:
	// an attempt made during the outage fails, as it should.
	waitOpt, waiting := locktest.Waiting()
	waiterC, wb := newClient(t, dlock.WithTTL(20*time.Second), dlock.WithWait(dlock.Constant(time.Minute)), waitOpt)
	got := locktest.Go(func() (*dlock.Lease, error) { return waiterC.Acquire(ctx, key) })
	parked(t, waiting, got)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	info, err := wb.Inspect(ctx, key)
	if err != nil || !info.Held || info.Owner != holder.Owner() {
		t.Fatalf("Inspect after restart: got %+v, %v; want held by the holder", info, err)
	}
	// Release once the listener is back (its heartbeat renewed the row).
	locktest.WaitFor(t, 30*time.Second, "the waiter's row live after the restart", func() bool {
		info, err := wb.Inspect(ctx, key)
		return err == nil && info.Waiters == 1
	})
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release after restart: %v", err)
	}
	l := locktest.Granted(t, got, 30*time.Second) // the holder's TTL (20s) bounds a lost wake-up
	t.Logf("waiter acquired %v after the release", time.Since(released))
	defer l.Release(ctx)
	if l.Fence() <= holder.Fence() {
		t.Fatalf("fence after the restart: got %d, want above %d", l.Fence(), holder.Fence())
	}
}

// After a restart every idle connection of the pool is broken: a call
// runs its statement again until it reaches a new connection, however
// many broken ones the pool holds (here all of them, none checked by the
// pool before use).
func TestRestartBrokenPool(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	pool := openPool(t, srv.DSN()+"&pool_max_conns=4", func(cfg *pgxpool.Config) {
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
	b := pglock.New(pool, pglock.WithoutListen())
	defer b.Close()
	r := dlock.Request{Key: locktest.Key(t), Token: "t", TTL: time.Minute}
	g := granted(t, ctx, b, r)
	r.Fence = g.Fence
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	for i := range conns {
		var err error
		if conns[i], err = pool.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if info, err := b.Inspect(ctx, r.Key); err != nil || !info.Held || info.Fence != g.Fence {
		t.Fatalf("Inspect after restart: got %+v, %v; want the lock held with fence %d", info, err, g.Fence)
	}
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("Release after restart: %v", err)
	}
}

// Invalid options are recorded by New and returned by every call.
func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    *pglock.Backend
	}{
		{"NilPool", pglock.New(nil)},
		{"BadSchema", pglock.New(newPool(t), pglock.WithSchema("Bad-Name"))},
		{"NilListenConfig", pglock.New(newPool(t), pglock.WithListenConfig(nil))},
		{"ShortWaiterTTL", pglock.New(newPool(t), pglock.WithWaiterTTL(time.Millisecond))},
		{"ShortSweep", pglock.New(newPool(t), pglock.WithSweepInterval(time.Second))},
		{"NilOption", pglock.New(newPool(t), nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.b.Err(); !errors.Is(err, dlock.ErrInvalidOption) || !strings.HasPrefix(err.Error(), "pglock: ") {
				t.Fatalf("Err: got %v, want a pglock error matching ErrInvalidOption", err)
			}
			_, err := tc.b.TryAcquire(locktest.Ctx(t, time.Second), dlock.Request{Key: "k", Token: "t", TTL: time.Second})
			if !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("TryAcquire: got %v, want ErrInvalidOption", err)
			}
		})
	}
}

// Without notifications Subscribe is unsupported and a waiter still gets
// the lock after a release, by the holder's TTL or its wait strategy.
func TestWithoutListen(t *testing.T) {
	key := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	b := pglock.New(newPool(t), pglock.WithoutListen())
	if _, _, err := b.Subscribe(ctx, key); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Subscribe: got %v, want ErrUnsupported", err)
	}
	waitOpt, waiting := locktest.Waiting()
	c := dlock.New(b, dlock.WithTTL(ttl), dlock.WithWait(dlock.Constant(20*time.Millisecond)), waitOpt)
	defer c.Close()
	holder := locktest.MustAcquire(t, ctx, c, key)
	got := locktest.Go(func() (*dlock.Lease, error) { return c.Acquire(ctx, key) })
	parked(t, waiting, got)
	holder.Release(ctx)
	locktest.Granted(t, got, 30*time.Second).Release(ctx)
}

// A waiter row no listener renews (its process died) stops being chosen
// once its waiter TTL has passed: the release wakes the live waiter
// behind it.
func TestDeadWaiterSkipped(t *testing.T) {
	key := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	holderC, _ := newClient(t, dlock.WithTTL(30*time.Second))
	holder := locktest.MustAcquire(t, ctx, holderC, key)
	// The row of a waiter whose process died a moment ago: older than any
	// live waiter, no listener behind its channel, expiring soon.
	exec(t, `INSERT INTO dlock.waiters (key, channel, tag, expires) VALUES ($1, 'dlock_gone', $2, now() + interval '100 milliseconds')`, key, time.Now().UnixNano())
	c, _ := newClient(t, dlock.WithTTL(30*time.Second), dlock.WithWait(dlock.Constant(time.Minute)))
	got := locktest.Go(func() (*dlock.Lease, error) { return c.Acquire(ctx, key) })
	pool := newPool(t)
	locktest.WaitFor(t, 30*time.Second, "the live waiter queued and the dead row expired", func() bool {
		var live, all int
		if err := pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE expires > now()), count(*) FROM dlock.waiters WHERE key = $1", key).Scan(&live, &all); err != nil {
			t.Fatal(err)
		}
		return live == 1 && all == 2
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// 10s: far below the holder's 30s TTL and the 1min strategy.
	locktest.Granted(t, got, 10*time.Second).Release(ctx)
}

// A Backend retries a key it freed last with an UPDATE of the free row
// alone. That choice never decides the outcome: a key another Backend
// took since is refused (the holder's row is live), a key whose row was
// deleted since is inserted again, and fences keep increasing across
// both paths.
func TestFreedKeyTakenOrDeleted(t *testing.T) {
	a := newBackend(t)
	other := newBackend(t)
	key := locktest.Key(t)
	var last uint64
	grant := func(b *pglock.Backend, token string) dlock.Request {
		t.Helper()
		r := dlock.Request{Key: key, Token: token, TTL: 5 * time.Second}
		g := granted(t, locktest.Ctx(t, 10*time.Second), b, r)
		if g.Fence <= last {
			t.Fatalf("TryAcquire(%s): got fence %d, want above %d", token, g.Fence, last)
		}
		last, r.Fence = g.Fence, g.Fence
		return r
	}
	release := func(b *pglock.Backend, r dlock.Request) {
		t.Helper()
		if err := b.Release(locktest.Ctx(t, 10*time.Second), r); err != nil {
			t.Fatalf("Release(%s): %v", r.Token, err)
		}
	}
	release(a, grant(a, "a1")) // a now remembers key as freed
	r := grant(other, "b1")
	if g, err := tryAcquire(t, a, dlock.Request{Key: key, Token: "a2", TTL: 5 * time.Second}); err != nil || g.OK {
		t.Fatalf("TryAcquire by a while b holds: got %+v, %v; want not granted", g, err)
	}
	release(other, r)
	release(a, grant(a, "a3"))
	exec(t, "DELETE FROM dlock.locks WHERE key = $1", key)
	release(a, grant(a, "a4"))
	release(a, grant(a, "a5"))
}

// TestAcquireNotSentNotUndone: an attempt that never reached the server
// (its context ended while it waited for a connection of the pool) is not
// undone: only a statement that may have run can have made a grant, and a
// clean-up would wait for a connection too, past the caller's deadline.
func TestAcquireNotSentNotUndone(t *testing.T) {
	pool := openPool(t, srv.DSN()+"&pool_max_conns=1&default_query_exec_mode=exec")
	b := locktest.Closing(t, pglock.New(pool))
	ctx := locktest.Ctx(t, 10*time.Second)
	r := dlock.Request{Key: locktest.Key(t), Token: "a", TTL: time.Second}
	if g, err := b.TryAcquire(ctx, r); err != nil || !g.OK { // the schema is set up
		t.Fatalf("TryAcquire: %+v, %v", g, err)
	}
	r.Token = "b"
	conn, err := pool.Acquire(ctx) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	before := pool.Stat().CanceledAcquireCount()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := b.TryAcquire(short, r); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire without a free connection: got %v, want context.DeadlineExceeded", err)
	}
	if n := pool.Stat().CanceledAcquireCount() - before; n != 1 {
		t.Fatalf("connection requests given up: %d, want 1 (the attempt's; no clean-up of a statement never sent)", n)
	}
}

// blackhole accepts TCP connections and never answers (a stalled or
// firewalled server). It returns a connection URL to it and a channel
// that receives once per accepted connection.
func blackhole(t *testing.T) (string, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 100)
	var (
		mu    sync.Mutex
		conns []net.Conn
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable", accepted
}

// stalled calls f on its own goroutine and returns once accepted (of a
// blackhole) receives: f then waits for a server that does not answer.
// The returned cancel ends f's context and fails the test unless f then
// returns context.Canceled. what names f in the messages.
func stalled(t *testing.T, ctx context.Context, accepted <-chan struct{}, what string, f func(context.Context) error) (cancel func()) {
	t.Helper()
	fctx, stop := context.WithTimeout(ctx, 30*time.Second)
	t.Cleanup(stop)
	done := make(chan error, 1)
	go func() { done <- f(fctx) }()
	select {
	case <-accepted:
	case err := <-done:
		t.Fatalf("%s on a server that does not answer returned: %v", what, err)
	}
	return func() {
		t.Helper()
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("first %s: got %v, want context.Canceled", what, err)
		}
	}
}

// While the first Subscribe dials the listen session (to a server that
// does not answer), a TryAcquire of the same Backend and another Subscribe
// return within their own contexts.
func TestListenDialDoesNotHoldUpOthers(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	url, accepted := blackhole(t)
	lc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, pglock.WithListenConfig(lc))
	key := locktest.Key(t)
	r := dlock.Request{Key: key, Token: "a", TTL: time.Minute}
	granted(t, ctx, b, r) // the schema is set up

	subscribe := func(c context.Context) error {
		_, _, err := b.Subscribe(c, key)
		return err
	}
	cancel := stalled(t, ctx, accepted, "Subscribe", subscribe) // dialing the listen session
	var g dlock.Grant
	err = within(t, ctx, 200*time.Millisecond, "TryAcquire", func(c context.Context) (err error) {
		g, err = b.TryAcquire(c, dlock.Request{Key: key + "/free", Token: "b", TTL: time.Minute})
		return err
	})
	if err != nil || !g.OK {
		t.Fatalf("TryAcquire of a free key while the listen session dials: got %+v, %v; want granted", g, err)
	}
	err = within(t, ctx, 200*time.Millisecond, "Subscribe", subscribe)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Subscribe while the first dials: got %v, want context.DeadlineExceeded", err)
	}
	cancel()
}

// While the first call sets the schema up (on a server that does not
// answer), another call returns when its own context ends.
func TestSetupWaitHonoursContext(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	url, accepted := blackhole(t)
	b := locktest.Closing(t, pglock.New(openPool(t, url), pglock.WithoutListen()))
	cancel := stalled(t, ctx, accepted, "Inspect", func(c context.Context) error { // setting up
		_, err := b.Inspect(c, "x")
		return err
	})
	err := within(t, ctx, 200*time.Millisecond, "TryAcquire", func(c context.Context) error {
		_, err := b.TryAcquire(c, dlock.Request{Key: "k", Token: "t", TTL: time.Second})
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire while another call sets up: got %v, want context.DeadlineExceeded", err)
	}
	cancel()
}

// dropProxy forwards to the test server; while armed > 0, a server reply
// chunk containing match is swallowed and both connections closed (the
// statement committed, its reply lost).
type dropProxy struct {
	*locktest.Proxy
	armed atomic.Int32
	drops atomic.Int32
	match []byte
}

func newDropProxy(t *testing.T, match string) *dropProxy {
	d := &dropProxy{match: []byte(match)}
	copyTo := func(dst, src net.Conn, drop bool) func() {
		return func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					if drop && d.armed.Load() > 0 && bytes.Contains(buf[:n], d.match) {
						d.armed.Add(-1)
						d.drops.Add(1)
						return // closes both
					}
					if _, werr := dst.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
	}
	d.Proxy = locktest.StartProxy(t, srv.Addr(), nil, func(c, s net.Conn) (func(), func()) {
		return copyTo(s, c, false), copyTo(c, s, true)
	})
	return d
}

// poolVia returns a pool of maxConns connections through addr.
func poolVia(t *testing.T, addr string, maxConns int) *pgxpool.Pool {
	t.Helper()
	return openPool(t, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&default_query_exec_mode=exec&pool_max_conns=%d", addr, maxConns))
}

// A release whose reply is lost (the statement committed, then the
// connection broke) is run again; the second run finds the lock freed and
// reports success, not ErrNotHeld: the Client would take that for a lost
// lease.
func TestReleaseLostReply(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	p := newDropProxy(t, "UPDATE 1\x00")
	b := locktest.Closing(t, pglock.New(poolVia(t, p.Addr(), 2), pglock.WithoutListen()))
	r := dlock.Request{Key: locktest.Key(t), Token: "a", TTL: time.Minute}
	r.Fence = granted(t, ctx, b, r).Fence
	p.armed.Store(1)
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("Release whose first reply was lost: %v", err)
	}
	if n := p.drops.Load(); n != 1 {
		t.Fatalf("replies dropped: %d, want 1", n)
	}
	if info, err := b.Inspect(ctx, r.Key); err != nil || info.Held {
		t.Fatalf("Inspect after the release: got %+v, %v; want free", info, err)
	}
	// With no run lost, a release of a lock not held still reports it.
	if err := b.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release: got %v, want ErrNotHeld", err)
	}
}

// A TryAcquire whose every run loses its reply (each may have committed a
// grant) fails, and gives back the grant of its last run as well as those
// of the earlier ones: the key is left free, not held by nobody for a TTL.
func TestAcquireLastLostReplyGivenBack(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	p := newDropProxy(t, "INSERT 0 1\x00")
	b := locktest.Closing(t, pglock.New(poolVia(t, p.Addr(), 2), pglock.WithoutListen()))
	key := locktest.Key(t)
	if _, err := b.Inspect(ctx, key); err != nil { // the schema is set up
		t.Fatal(err)
	}
	p.armed.Store(100)
	g, err := b.TryAcquire(ctx, dlock.Request{Key: key, Token: "a", TTL: time.Minute})
	p.armed.Store(0)
	if err == nil {
		t.Fatalf("TryAcquire whose every reply was lost: got %+v, want an error", g)
	}
	if n := p.drops.Load(); n != 3 { // the pool's 2 connections + 1
		t.Fatalf("replies dropped: %d, want 3", n)
	}
	if info, err := b.Inspect(ctx, key); err != nil || info.Held {
		t.Fatalf("Inspect after the failed TryAcquire: got %+v, %v; want free", info, err)
	}
}

// Guard compares the lease's deadline with the time it runs, not with the
// start of the writer's transaction (now()): a lease that expired after
// the transaction began is refused.
func TestGuardExpiredInTransaction(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	b := newBackend(t, pglock.WithoutListen())
	c := dlock.New(b, dlock.WithTTL(300*time.Millisecond), dlock.WithAutoRenew(false))
	defer c.Close()
	l := locktest.MustAcquire(t, ctx, c, locktest.Key(t))
	tx, err := newPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // the transaction has begun
		t.Fatal(err)
	}
	locktest.WaitFor(t, 10*time.Second, "the lease expires on the server", func() bool {
		info, err := b.Inspect(ctx, l.Key())
		return err == nil && !info.Held
	})
	if err := b.Guard(ctx, tx, l); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Guard of a lease that expired after the transaction began: got %v, want ErrLost", err)
	}
}

// Keys that dlock.ValidateKey accepts but PostgreSQL text cannot hold (a
// NUL byte, invalid UTF-8) are refused with ErrInvalidKey, naming the
// problem, before any statement: here the server never answers.
func TestKeyNotText(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	url, _ := blackhole(t)
	pool := openPool(t, url)
	b := locktest.Closing(t, pglock.New(pool))
	s := locktest.Closing(t, pglock.NewSession(pool))
	for key, problem := range map[string]string{"a\x00b": "NUL byte", "ab\xff\xfe": "not valid UTF-8"} {
		if err := dlock.ValidateKey(key); err != nil {
			t.Fatalf("ValidateKey(%q): %v", key, err)
		}
		r := dlock.Request{Key: key, Token: "t", TTL: time.Second}
		type backend interface {
			dlock.Backend
			dlock.Inspector
			dlock.ForceReleaser
			dlock.Notifier
		}
		for name, be := range map[string]backend{"lease": b, "session": s} {
			calls := map[string]func(context.Context) error{
				"TryAcquire":   func(c context.Context) error { _, err := be.TryAcquire(c, r); return err },
				"Refresh":      func(c context.Context) error { return be.Refresh(c, r) },
				"Release":      func(c context.Context) error { return be.Release(c, r) },
				"Inspect":      func(c context.Context) error { _, err := be.Inspect(c, key); return err },
				"ForceRelease": func(c context.Context) error { _, err := be.ForceRelease(c, key); return err },
				"Subscribe":    func(c context.Context) error { _, _, err := be.Subscribe(c, key); return err },
			}
			if name == "lease" {
				calls["RefreshMany"] = func(c context.Context) error { return b.RefreshMany(c, []dlock.Request{r})[0] }
			}
			for op, call := range calls {
				err := within(t, ctx, 5*time.Second, op, call)
				if !errors.Is(err, dlock.ErrInvalidKey) || !strings.Contains(err.Error(), problem) {
					t.Errorf("%s %s(%q): got %v; want ErrInvalidKey saying %q", name, op, key, err, problem)
				}
			}
		}
		// Through a Client, on a server that answers.
		c, _ := newClient(t)
		if l, err := c.Acquire(ctx, key); !errors.Is(err, dlock.ErrInvalidKey) {
			if l != nil {
				l.Release(ctx)
			}
			t.Errorf("Client.Acquire(%q): got %v; want ErrInvalidKey", key, err)
		}
	}
}
