package pglock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/pglock"
)

var _ interface {
	dlock.Backend
	dlock.Notifier
	dlock.LossNotifier
	dlock.Inspector
	dlock.ForceReleaser
	dlock.TTLFloor
	dlock.TTLLimiter
	dlock.BatchRefresher
} = (*pglock.SessionBackend)(nil)

// A session terminated by the server frees the lock at once and the
// holder learns it through the loss signal at its next renewal.
func TestSessionTerminated(t *testing.T) {
	key := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	c := dlock.New(pglock.NewSession(newPool(t)), dlock.WithTTL(ttl))
	defer c.Close()
	l := locktest.MustAcquire(t, ctx, c, key)
	other := dlock.New(pglock.NewSession(newPool(t)), dlock.WithTTL(ttl))
	defer other.Close()
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock: got %v, want ErrNotAcquired", err)
	}
	// The administrator ends the holder's session.
	admin := newSession(t)
	info, err := admin.ForceRelease(ctx, key)
	if err != nil || !info.Held {
		t.Fatalf("ForceRelease: got %+v, %v; want the held lock", info, err)
	}
	l2, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire after the holder's session ended: %v", err)
	}
	defer l2.Release(context.Background())
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence after takeover: got %d, want > %d", l2.Fence(), l.Fence())
	}
	select {
	case <-l.Done():
	case <-time.After(5 * ttl):
		t.Fatal("holder whose session was terminated: Done not closed")
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("holder's Err: got %v, want ErrLost", err)
	}
}

// A holder that stops renewing loses the lock with its session: the
// server ends a session idle for the lease's TTL.
func TestSessionIdleTimeout(t *testing.T) {
	key := locktest.Key(t)
	ctx := locktest.Ctx(t, time.Minute)
	c := dlock.New(pglock.NewSession(newPool(t)), dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	defer c.Close()
	l := locktest.MustAcquire(t, ctx, c, key)
	other := dlock.New(pglock.NewSession(newPool(t)), dlock.WithTTL(ttl), dlock.WithWait(dlock.Constant(20*time.Millisecond)))
	defer other.Close()
	l2, err := other.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire after the holder went idle: %v", err)
	}
	defer l2.Release(context.Background())
	if time.Now().Before(l.Expires()) {
		t.Fatalf("lock taken over at %v, before the holder's Expires %v", time.Now(), l.Expires())
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence after takeover: got %d, want > %d", l2.Fence(), l.Fence())
	}
}

// Refresh checks the session; Release unlocks once, then ErrNotHeld.
func TestSessionRefreshRelease(t *testing.T) {
	b := newSession(t)
	ctx := locktest.Ctx(t, time.Minute)
	r := dlock.Request{Key: locktest.Key(t), Token: "t", TTL: time.Second}
	g := granted(t, ctx, b, r)
	r.Fence = g.Fence
	if err := b.Refresh(ctx, r); err != nil {
		t.Fatalf("Refresh on a session: %v", err)
	}
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := b.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release: got %v, want ErrNotHeld", err)
	}
}

// A re-entry sets the deadline to at least now + its TTL, as every grant
// does; one with a shorter TTL does not shorten it.
func TestSessionReentryDeadline(t *testing.T) {
	s := newSession(t)
	ctx := locktest.Ctx(t, time.Minute)
	r := dlock.Request{Key: locktest.Key(t), Token: "a", TTL: time.Second, Reentrant: true}
	granted(t, ctx, s, r)
	start := time.Now()
	for i, ttl := range []time.Duration{5 * time.Second, time.Second} {
		r.TTL = ttl
		if g := granted(t, ctx, s, r); g.Count != i+2 {
			t.Fatalf("re-entry with TTL %v: got count %d, want %d", ttl, g.Count, i+2)
		}
		info, err := s.Inspect(ctx, r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if info.TTL+time.Since(start)+2*time.Millisecond < 5*time.Second {
			t.Fatalf("after a re-entry with TTL %v: server TTL %v, want at least 5s from before the 5s re-entry (%v ago)", ttl, info.TTL, time.Since(start))
		}
	}
	for range 3 {
		if err := s.Release(ctx, r); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// A hold whose last loss registration stops without a release (the Client
// gave the lease up, as after a loss) is given up: its session lock is
// unlocked, and the key can be taken again, also through the same
// SessionBackend, once the grant's deadline has passed (the holder was
// not released). A hold that still has a registration stays held.
func TestSessionGivenUpWhenUnwatched(t *testing.T) {
	s := newSession(t)
	ctx := locktest.Ctx(t, 30*time.Second)
	key := locktest.Key(t)
	r := dlock.Request{Key: key, Token: "a", TTL: 5 * time.Second}
	start := time.Now()
	g := granted(t, ctx, s, r)
	r.Fence = g.Fence
	deadline := serverDeadline(t, ctx, key) // for the report only
	stop1 := s.NotifyLoss(r, func(error) {})
	stop2 := s.NotifyLoss(r, func(error) {})
	stop1()
	other := dlock.Request{Key: key, Token: "b", TTL: 5 * time.Second}
	if g, err := s.TryAcquire(ctx, other); err != nil || g.OK {
		t.Fatalf("TryAcquire(b) with a registration left: got %+v, %v; want not granted", g, err)
	}
	stop2()
	stop2() // stopping twice counts once
	for {
		g, err := s.TryAcquire(ctx, other)
		if err != nil {
			t.Fatalf("TryAcquire(b) after the last stop: %v", err)
		}
		if g.OK {
			if early := time.Until(start.Add(r.TTL)); early > 0 {
				t.Fatalf("TryAcquire(b) granted %v before the given-up grant's deadline (start + TTL; the row's deadline on the server's clock came %v after start)",
					early, deadline.Sub(start))
			}
			if g.Fence <= r.Fence {
				t.Fatalf("TryAcquire(b): got fence %d, want above %d", g.Fence, r.Fence)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the hold was not given up after its last registration stopped")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := s.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release(a) after it was given up: got %v, want ErrNotHeld", err)
	}
}

// serverDeadline returns when key's row expires, on this process's clock:
// now plus the row's remaining time on the server's clock.
func serverDeadline(t *testing.T, ctx context.Context, key string) time.Time {
	t.Helper()
	var remain int64
	err := newPool(t).QueryRow(ctx, `SELECT (extract(epoch FROM expires - clock_timestamp()) * 1e6)::bigint FROM dlock.locks WHERE key = $1`, key).Scan(&remain)
	if err != nil {
		t.Fatalf("read the row's deadline: %v", err)
	}
	return time.Now().Add(time.Duration(remain) * time.Microsecond)
}

// terminateHolder ends the server session that holds key's lock as the
// grant with fence (pg_terminate_backend, waiting until it has exited),
// as a killed process or a reset connection would end it.
func terminateHolder(t *testing.T, ctx context.Context, fence uint64) {
	t.Helper()
	var n int
	err := newPool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE application_name LIKE 'dlock ' || $1::bigint || ' %' AND pg_terminate_backend(pid, 10000)`, int64(fence)).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminate the holder's session: got %d sessions, %v; want 1", n, err)
	}
}

// A grant whose session ends without a release (the holder was killed, or
// its connection reset) keeps the lock until the grant's deadline, the
// latest Expires its holder may compute: another Backend is not granted
// before it, and is granted after it with a higher fence. Inspect shows
// the lock held meanwhile. A release ends the delay, even after the
// session ended.
func TestSessionLockDelay(t *testing.T) {
	const delayTTL = 2 * time.Second
	ctx := locktest.Ctx(t, time.Minute)
	holder := newSession(t)
	other := newSession(t)
	r := dlock.Request{Key: locktest.Key(t), Token: "holder", TTL: delayTTL}
	start := time.Now()
	g := granted(t, ctx, holder, r)
	expires := start.Add(delayTTL) // no Lease's Expires is later
	terminateHolder(t, ctx, g.Fence)

	info, err := other.Inspect(ctx, r.Key)
	switch {
	case err != nil:
		t.Fatalf("Inspect: %v", err)
	case time.Now().Before(expires) && (!info.Held || info.Owner != r.Token || info.Fence != g.Fence || info.TTL <= 0):
		t.Fatalf("Inspect during the lock-delay: got %+v; want held by %q, fence %d, TTL > 0", info, r.Token, g.Fence)
	}
	// A subscribed waiter's attempts report the holder's remaining TTL.
	_, unsubscribe, err := other.Subscribe(ctx, r.Key)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer unsubscribe()
	o := dlock.Request{Key: r.Key, Token: "other", TTL: delayTTL}
	refused := 0
	for {
		og, err := other.TryAcquire(ctx, o)
		done := time.Now()
		if err != nil {
			t.Fatalf("TryAcquire(other): %v", err)
		}
		if og.OK {
			if done.Before(expires) {
				t.Fatalf("granted at %v, before the terminated grant's Expires %v", done, expires)
			}
			if og.Fence <= g.Fence {
				t.Fatalf("fence after the lock-delay: got %d, want > %d", og.Fence, g.Fence)
			}
			o.Fence = og.Fence
			break
		}
		if og.HolderTTL <= 0 || og.HolderTTL > delayTTL {
			t.Fatalf("TryAcquire(other) during the lock-delay: HolderTTL %v, want in (0, %v]", og.HolderTTL, delayTTL)
		}
		refused++
		select {
		case <-ctx.Done():
			t.Fatal("never granted after the lock-delay")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if refused == 0 {
		t.Fatal("the first attempt after the holder's session ended was granted: no lock-delay")
	}
	if err := holder.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release(holder) after the delay: got %v, want ErrNotHeld", err)
	}

	// A release by the holder whose session ended frees the lock at once.
	terminateHolder(t, ctx, o.Fence)
	if err := other.Release(ctx, o); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release(other) after its session ended: got %v, want ErrNotHeld", err)
	}
	r.Fence = 0
	if g, err := holder.TryAcquire(ctx, r); err != nil || !g.OK {
		t.Fatalf("TryAcquire after a release whose session had ended: got %+v, %v; want granted at once", g, err)
	}
}

// A clean release ends the hold at once: another Backend is granted
// without waiting for the released grant's deadline.
func TestSessionReleaseNoDelay(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	holder := newSession(t)
	other := newSession(t)
	r := dlock.Request{Key: locktest.Key(t), Token: "holder", TTL: time.Minute}
	g := granted(t, ctx, holder, r)
	r.Fence = g.Fence
	if err := holder.Refresh(ctx, r); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	o := dlock.Request{Key: r.Key, Token: "other", TTL: time.Minute}
	if og, err := other.TryAcquire(ctx, o); err != nil || og.OK {
		t.Fatalf("TryAcquire(other) while held: got %+v, %v; want not granted", og, err)
	}
	if err := holder.Release(ctx, r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	og, err := other.TryAcquire(ctx, o)
	if err != nil || !og.OK || og.Fence <= g.Fence {
		t.Fatalf("TryAcquire(other) after the release: got %+v, %v; want granted at once with a fence above %d", og, err, g.Fence)
	}
	o.Fence = og.Fence
	if err := other.Release(ctx, o); err != nil {
		t.Fatalf("Release(other): %v", err)
	}
}

// lockRow locks key's row FOR UPDATE in a transaction of its own (as a
// stuck writer or a slow server would hold it up) until the returned
// function rolls it back; it is rolled back when the test ends too.
func lockRow(t *testing.T, ctx context.Context, key string) (rollback func()) {
	t.Helper()
	admin, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT 1 FROM dlock.locks WHERE key = $1 FOR UPDATE) r", key).Scan(&n); err != nil || n != 1 {
		t.Fatalf("lock the row of %q: got %d rows, %v", key, n, err)
	}
	var once sync.Once
	rollback = func() {
		once.Do(func() {
			_ = tx.Rollback(context.Background())
			_ = admin.Close(context.Background())
		})
	}
	t.Cleanup(rollback)
	return rollback
}

// within calls f on its own goroutine with a context that ends after
// timeout, and returns its error; it fails the test if f has not returned
// 10s later (a hang). what names f in the message.
func within(t *testing.T, ctx context.Context, timeout time.Duration, what string, f func(context.Context) error) error {
	t.Helper()
	const bound = 10 * time.Second
	ch := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		ch <- f(c)
	}()
	select {
	case err := <-ch:
		return err
	case <-time.After(bound):
		t.Fatalf("%s: still running after %v", what, bound)
		return nil
	}
}

// While a renewal is held up on the server (here by a row lock), Refresh
// and Release return when their context ends. The release then goes on in
// the background: it ends the session, which frees the session lock while
// the renewal is still held up, and frees the row once it can.
func TestSessionCallsHonourContext(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	s := newSession(t)
	r := dlock.Request{Key: locktest.Key(t), Token: "a", TTL: time.Minute}
	r.Fence = granted(t, ctx, s, r).Fence
	rollback := lockRow(t, ctx, r.Key)
	refresh := func(c context.Context) error { return s.Refresh(c, r) }
	// The first starts a renewal that waits for the row; the second waits
	// for the connection the first holds.
	for i := range 2 {
		if err := within(t, ctx, 100*time.Millisecond, "Refresh", refresh); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Refresh #%d while the renewal is held up: got %v, want context.DeadlineExceeded", i+1, err)
		}
	}
	err := within(t, ctx, 100*time.Millisecond, "Release", func(c context.Context) error { return s.Release(c, r) })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release while the renewal is held up: got %v, want context.DeadlineExceeded", err)
	}
	// The row is still locked: only the end of the holder's session can
	// have freed the session lock.
	pool := newPool(t)
	locktest.WaitFor(t, 10*time.Second, "the holder's session ends", func() bool {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'dlock ' || $1::bigint || ' %'", int64(r.Fence)).Scan(&n)
		return err == nil && n == 0
	})
	rollback()
	locktest.WaitFor(t, 10*time.Second, "the released row is freed", func() bool {
		info, err := s.Inspect(ctx, r.Key)
		return err == nil && !info.Held
	})
	if err := s.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Release: got %v, want ErrNotHeld", err)
	}
}

// The session mode's TTL is the session's idle_session_timeout, at most
// 2^31-1 ms: MaxTTL reports it (dlock.TTLLimiter), a TTL up to it is
// granted, and a longer one is refused with ErrInvalidTTL, also through a
// Client, before any statement.
func TestSessionMaxTTL(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	s := newSession(t)
	const max = (1<<31 - 1) * time.Millisecond
	lim, ok := any(s).(dlock.TTLLimiter)
	if !ok || lim.MaxTTL() != max {
		t.Fatalf("SessionBackend as a dlock.TTLLimiter: %v; want MaxTTL %v", ok, max)
	}
	r := dlock.Request{Key: locktest.Key(t), Token: "a", TTL: max}
	r.Fence = granted(t, ctx, s, r).Fence
	if err := s.Refresh(ctx, r); err != nil {
		t.Fatalf("Refresh with the largest TTL: %v", err)
	}
	if err := s.Release(ctx, r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, ttl := range []time.Duration{max + time.Millisecond, 25 * 24 * time.Hour} {
		g, err := s.TryAcquire(ctx, dlock.Request{Key: r.Key, Token: "b", TTL: ttl})
		if !errors.Is(err, dlock.ErrInvalidTTL) {
			t.Fatalf("TryAcquire with TTL %v: got %+v, %v; want ErrInvalidTTL", ttl, g, err)
		}
	}
	c := dlock.New(s, dlock.WithTTL(25*24*time.Hour))
	defer c.Close()
	if l, err := c.Acquire(ctx, r.Key); !errors.Is(err, dlock.ErrInvalidTTL) {
		if l != nil {
			l.Release(ctx)
		}
		t.Fatalf("Client.Acquire with TTL 25 days: got %v; want ErrInvalidTTL", err)
	}
}

// RefreshMany renews each hold on its own session, all at once: a renewal
// held up on one session (here by a row lock) does not hold up another,
// through the backend or through a Client's watchdog.
func TestSessionRefreshManyIndependent(t *testing.T) {
	ctx := locktest.Ctx(t, time.Minute)
	s := newSession(t)
	batch, ok := any(s).(dlock.BatchRefresher)
	if !ok {
		t.Fatal("SessionBackend is not a dlock.BatchRefresher")
	}
	key := locktest.Key(t)
	stuck := dlock.Request{Key: key + "/stuck", Token: "a", TTL: time.Minute}
	stuck.Fence = granted(t, ctx, s, stuck).Fence
	healthy := dlock.Request{Key: key + "/healthy", Token: "b", TTL: time.Minute}
	healthy.Fence = granted(t, ctx, s, healthy).Fence
	rollback := lockRow(t, ctx, stuck.Key)
	var errs []error
	within(t, ctx, 500*time.Millisecond, "RefreshMany", func(c context.Context) error {
		errs = batch.RefreshMany(c, []dlock.Request{stuck, healthy})
		return nil
	})
	if !errors.Is(errs[0], context.DeadlineExceeded) || errs[1] != nil {
		t.Fatalf("RefreshMany(held up, healthy): got %v; want [context.DeadlineExceeded, nil]", errs)
	}
	rollback()
	for _, r := range []dlock.Request{stuck, healthy} {
		if err := s.Release(ctx, r); err != nil {
			t.Fatalf("Release(%s): %v", r.Key, err)
		}
	}

	// Through a Client: lease b outlives several renewal periods while
	// lease a's renewals are held up.
	const ttl = 900 * time.Millisecond
	c := dlock.New(s, dlock.WithTTL(ttl))
	defer c.Close()
	a := locktest.MustAcquire(t, ctx, c, key+"/a")
	defer a.Release(context.Background())
	b := locktest.MustAcquire(t, ctx, c, key+"/b")
	defer b.Release(context.Background())
	defer lockRow(t, ctx, key+"/a")()
	select {
	case <-b.Done():
		t.Fatalf("lease b lost while only a's renewals were held up: %v", b.Err())
	case <-time.After(4 * ttl):
	}
}
