package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// helperEnv, when set in the environment ("ADDR KEY"), makes the test
// binary a FIFO waiter process instead of running tests (see helperMain).
const helperEnv = "REDISLOCK_TEST_WAITER"

// helperMain is a waiter process: it queues for KEY on ADDR with
// WithFIFO and waits (and would hold the lock) until it is killed. Its
// waiter TTL is 5s, so that it still counts as live when the lock is
// released just after it was killed (the worst case for the others,
// however late its last heartbeat was on a loaded machine).
func helperMain() int {
	addr, key, _ := strings.Cut(os.Getenv(helperEnv), " ")
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	c := dlock.New(redislock.New(rdb, redislock.WithWaiterTTL(5*time.Second)))
	l, err := c.Acquire(context.Background(), key, dlock.WithFIFO())
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	fmt.Println("acquired", l.Fence())
	time.Sleep(time.Hour)
	return 0
}

// queueLen returns the number of entries in key's FIFO queue.
func queueLen(t testing.TB, rdb *redis.Client, b *redislock.Backend, key string) int64 {
	t.Helper()
	n, err := rdb.ZCard(context.Background(), b.LockName(key)+":q").Result()
	if err != nil {
		t.Fatalf("ZCARD of the queue: %v", err)
	}
	return n
}

// waiter is an Acquire running on its own goroutine.
type waiter struct {
	got  chan *dlock.Lease
	errc chan error
}

func startAcquire(c *dlock.Client, ctx context.Context, key string, opts ...dlock.Option) *waiter {
	w := &waiter{got: make(chan *dlock.Lease, 1), errc: make(chan error, 1)}
	go func() {
		l, err := c.Acquire(ctx, key, opts...)
		if err != nil {
			w.errc <- err
			return
		}
		w.got <- l
	}()
	return w
}

// lease returns the waiter's lease, failing the test after d.
func (w *waiter) lease(t *testing.T, d time.Duration, what string) *dlock.Lease {
	t.Helper()
	select {
	case l := <-w.got:
		return l
	case err := <-w.errc:
		t.Fatalf("%s: %v", what, err)
	case <-time.After(d):
		t.Fatalf("%s: not acquired within %v", what, d)
	}
	return nil
}

// TestFIFOOrder queues eight waiters, each with its own Client and
// connection (as eight processes would), one after the other, and checks
// that they are served exactly in arrival order, with increasing fences,
// and that each release is PUBLISHed once, to the next waiter only.
func TestFIFOOrder(t *testing.T) {
	const n = 8
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	holder := newClient(t, newRDB(t, srv.Addr()))
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []int
	)
	done := make(chan error, n)
	for i := 0; i < n; i++ {
		c := newClient(t, newRDB(t, srv.Addr()))
		go func() {
			l, err := c.Acquire(ctx, k, dlock.WithFIFO())
			if err != nil {
				done <- err
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			done <- l.Release(ctx)
		}()
		// The next waiter starts once this one is in the queue.
		waitFor(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool {
			return queueLen(t, admin, b, k) == int64(i+1)
		})
	}
	if info, err := b.Inspect(ctx, k); err != nil || info.Waiters != n {
		t.Fatalf("Inspect: got %+v, %v, want %d waiters", info, err, n)
	}
	published := publishCalls(t, admin)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d waiters served within 10s", i, n)
		}
	}
	for i, got := range order {
		if got != i {
			t.Fatalf("service order: got %v, want 0..%d in arrival order", order, n-1)
		}
	}
	// One PUBLISH per hand-off (n of them; the last release frees the lock
	// and publishes nothing, as nobody else waits).
	if p := publishCalls(t, admin) - published; p != n {
		t.Fatalf("PUBLISH calls for %d hand-offs: got %d, want %d (one per release, to the next waiter only)", n, p, n)
	}
	if q := queueLen(t, admin, b, k); q != 0 {
		t.Fatalf("queue after every waiter was served: got %d entries, want 0", q)
	}
}

// TestFIFOFences checks that hand-offs issue increasing fences, that the
// woken waiter owns the lock once Acquire returns, with a lease that does
// not outlive the server's reservation, and that its first renewal gives
// the lock the lease TTL.
func TestFIFOFences(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	a := newClient(t, newRDB(t, srv.Addr()), dlock.WithTTL(time.Minute))
	c := newClient(t, newRDB(t, srv.Addr()), dlock.WithTTL(time.Minute))
	last, err := a.Acquire(ctx, k, dlock.WithFIFO())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		next := a
		if i%2 == 0 {
			next = c
		}
		w := startAcquire(next, ctx, k, dlock.WithFIFO())
		waitFor(t, 5*time.Second, "the waiter queued", func() bool { return queueLen(t, admin, b, k) == 1 })
		if err := last.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := w.lease(t, 5*time.Second, "waiter")
		if l.Fence() <= last.Fence() {
			t.Fatalf("hand-off %d: fence got %d, want > %d", i, l.Fence(), last.Fence())
		}
		t0 := time.Now()
		info, err := b.Inspect(ctx, k)
		if err != nil || info.Owner != l.Owner() || info.Fence != l.Fence() {
			t.Fatalf("hand-off %d: lock on the server %+v, %v, want owner %q fence %d", i, info, err, l.Owner(), l.Fence())
		}
		// The server's expiry is at least t0 + its PTTL (ms, rounded down).
		if exp, limit := l.Expires(), t0.Add(info.TTL+time.Millisecond); exp.After(limit) {
			t.Fatalf("hand-off %d: lease expires %v after the server's expiry (TTL %v)", i, exp.Sub(limit), info.TTL)
		}
		waitFor(t, 5*time.Second, "the lease TTL on the server (the first renewal)", func() bool {
			info, err := b.Inspect(ctx, k)
			return err == nil && info.Owner == l.Owner() && info.TTL > 50*time.Second
		})
		waitFor(t, 5*time.Second, "the lease's Expires a minute ahead", func() bool {
			return time.Until(l.Expires()) > 50*time.Second
		})
		last = l
	}
	if err := last.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFIFOCancelLeavesQueue cancels a queued waiter: its entry is gone at
// once (not after the waiter TTL), and the waiter behind it is served by
// the next release.
func TestFIFOCancelLeavesQueue(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	// A waiter TTL of 10s: a cancelled entry left behind would be visible.
	opt := redislock.WithWaiterTTL(10 * time.Second)
	holder := newClient(t, newRDB(t, srv.Addr()))
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := startAcquire(dlockClient(t, newRDB(t, srv.Addr()), opt), cctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the first waiter queued", func() bool { return queueLen(t, admin, b, k) == 1 })
	second := startAcquire(dlockClient(t, newRDB(t, srv.Addr()), opt), ctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the second waiter queued", func() bool { return queueLen(t, admin, b, k) == 2 })
	cancel()
	start := time.Now()
	select {
	case err := <-first.errc:
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: got %v, want ErrNotAcquired and context.Canceled", err)
		}
	case <-first.got:
		t.Fatal("cancelled waiter acquired the lock")
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled waiter did not return")
	}
	// Acquire returns after the cleanup: the entry is gone already.
	if q := queueLen(t, admin, b, k); q != 1 {
		t.Fatalf("queue right after the cancelled Acquire returned: got %d entries, want 1", q)
	}
	t.Logf("cancelled waiter returned and left the queue in %v", time.Since(start))
	if info, err := b.Inspect(ctx, k); err != nil || info.Waiters != 1 {
		t.Fatalf("Inspect: got %+v, %v, want 1 waiter", info, err)
	}
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := second.lease(t, 5*time.Second, "second waiter")
	if d := time.Since(released); d > time.Second {
		t.Fatalf("second waiter served %v after the release, want promptly", d)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// cancelHook fails the first script a waiter sends after it is armed
// (the claim of a lock handed to it) and cancels the waiter's context,
// as if the context ended just as the hand-off arrived.
type cancelHook struct {
	mu     sync.Mutex
	armed  bool
	cancel context.CancelFunc
}

func (h *cancelHook) arm() {
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

func (h *cancelHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cancelHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		fire := h.armed && (cmd.Name() == "evalsha" || cmd.Name() == "eval")
		if fire {
			h.armed = false
		}
		h.mu.Unlock()
		if fire {
			h.cancel()
			err := errors.New("test: claim dropped")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h *cancelHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFIFOCancelAfterHandOff: the lock is handed to a waiter whose
// context ends before it claims it. The waiter passes it on to the next
// one at once, not after the claim TTL (10s here). The waiter is
// reentrant (WithOwner), so it claims the hand-off with a request, which
// the hook fails while cancelling its context.
func TestFIFOCancelAfterHandOff(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	opt := redislock.WithWaiterTTL(10 * time.Second)
	holder := dlockClient(t, newRDB(t, srv.Addr()), opt)
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hook := &cancelHook{cancel: cancel}
	rdbA := newRDB(t, srv.Addr())
	rdbA.AddHook(hook)
	first := startAcquire(dlockClient(t, rdbA, opt), cctx, k, dlock.WithFIFO(), dlock.WithOwner("first"))
	waitFor(t, 5*time.Second, "the first waiter queued", func() bool { return queueLen(t, admin, b, k) == 1 })
	second := startAcquire(dlockClient(t, newRDB(t, srv.Addr()), opt), ctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the second waiter queued", func() bool { return queueLen(t, admin, b, k) == 2 })
	hook.arm()
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-first.errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("first waiter: got %v, want context.Canceled", err)
		}
	case l := <-first.got:
		t.Fatalf("first waiter acquired (fence %d), want its context cancelled before the claim", l.Fence())
	case <-time.After(5 * time.Second):
		t.Fatal("first waiter did not return")
	}
	l := second.lease(t, 5*time.Second, "second waiter")
	d := time.Since(released)
	t.Logf("second waiter served %v after the release", d)
	if d > 2*time.Second {
		t.Fatalf("second waiter served %v after the release, want at once (the claim TTL is 10s)", d)
	}
	if l.Fence() <= h.Fence() {
		t.Fatalf("second waiter's fence: got %d, want > %d", l.Fence(), h.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "an empty queue", func() bool { return queueLen(t, admin, b, k) == 0 })
	if info, err := b.Inspect(ctx, k); err != nil || info.Held {
		t.Fatalf("lock after the last release: got %+v, %v, want free", info, err)
	}
}

// dlockClient returns a Client on a Backend with opts, closed when the
// test ends.
func dlockClient(t *testing.T, rdb redislock.Client, opts ...redislock.Option) *dlock.Client {
	t.Helper()
	b := redislock.New(rdb, opts...)
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(b)
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Client.Close: %v", err)
		}
	})
	return c
}

// TestFIFOKilledWaiterProcess SIGKILLs a waiter PROCESS at the head of
// the queue just before the holder releases: the lock is handed to the
// dead waiter (its heartbeat is still fresh) and nobody claims it. The
// live waiter behind it is served within the documented bound: the
// waiter TTL (the claim TTL the releasing Backend sets) plus a quarter of
// it (the live waiter's heartbeat).
func TestFIFOKilledWaiterProcess(t *testing.T) {
	ttl := redislock.DefaultWaiterTTL
	bound := ttl + ttl/4 + 100*time.Millisecond // + a round trip and scheduling
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	holder := newClient(t, newRDB(t, srv.Addr()))
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}

	// The waiter process: this test binary again, in helper mode.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+srv.Addr()+" "+k)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill() // by PID; harmless after it exited
		<-exited
	})
	waitFor(t, 10*time.Second, "the waiter process queued", func() bool { return queueLen(t, admin, b, k) == 1 })

	w := startAcquire(newClient(t, newRDB(t, srv.Addr())), ctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the second waiter queued", func() bool { return queueLen(t, admin, b, k) == 2 })

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := w.lease(t, 10*time.Second, "the waiter behind the killed one")
	d := time.Since(released)
	t.Logf("waiter served %v after the release (bound: waiter TTL %v + %v + slack = %v)", d, ttl, ttl/4, bound)
	if d > bound {
		t.Fatalf("a killed waiter at the head delayed the next one by %v, want at most %v", d, bound)
	}
	if d < ttl/2 {
		t.Fatalf("served %v after the release: the lock was not handed to the killed waiter first, the test tests nothing", d)
	}
	if l.Fence() <= h.Fence() {
		t.Fatalf("fence: got %d, want > %d", l.Fence(), h.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFIFODeadWaiterSkipped: a waiter whose heartbeat is older than the
// waiter TTL when the lock is released is skipped at once: the next one
// is served without delay.
func TestFIFODeadWaiterSkipped(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	holder := newClient(t, newRDB(t, srv.Addr()))
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	lock := b.LockName(k)
	// A dead waiter's entries, as a process killed long ago leaves them:
	// queued first, heartbeat deadline in the past.
	member := strings.Repeat("D", 26) + "dead-token"
	admin.ZAdd(ctx, lock+":q", redis.Z{Score: 0.5, Member: member})
	admin.ZAdd(ctx, lock+":hb", redis.Z{Score: 1, Member: member})
	w := startAcquire(newClient(t, newRDB(t, srv.Addr())), ctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the live waiter queued", func() bool { return queueLen(t, admin, b, k) == 2 })
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := w.lease(t, 5*time.Second, "live waiter")
	if d := time.Since(released); d > 200*time.Millisecond {
		t.Fatalf("live waiter behind a dead one served %v after the release, want at once", d)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if q := queueLen(t, admin, b, k); q != 0 {
		t.Fatalf("queue: got %d entries, want 0 (the dead one dropped)", q)
	}
}

// TestFIFOHolderExpires: the holder never releases (no renewal); the
// first FIFO waiter takes the lock right after its TTL runs out (expiry
// publishes nothing: the first waiter schedules a check at the holder's
// remaining TTL).
func TestFIFOHolderExpires(t *testing.T) {
	const ttl = 300 * time.Millisecond
	holder := newClient(t, newRDB(t, srv.Addr()), dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	c := newClient(t, newRDB(t, srv.Addr()))
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l, err := c.Acquire(ctx, k, dlock.WithFIFO())
	if err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	t.Logf("FIFO waiter acquired %v after the holder (TTL %v)", d, ttl)
	if d > ttl+200*time.Millisecond {
		t.Fatalf("FIFO waiter acquired %v after the holder, want right after its TTL %v (< +200ms)", d, ttl)
	}
	if l.Fence() <= h.Fence() {
		t.Fatalf("fence: got %d, want > %d", l.Fence(), h.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFIFONotOvertaken: a lock that freed itself without a release (DEL,
// as an expiry would) while a FIFO waiter is queued may be taken by a
// TryAcquire, which does not read the queue; the waiter's next heartbeat
// marks the new holder's lock, and its release hands it to the waiter.
func TestFIFONotOvertaken(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	holder := newClient(t, newRDB(t, srv.Addr()), dlock.WithTTL(time.Minute))
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	w := startAcquire(dlockClient(t, newRDB(t, srv.Addr())), ctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the waiter queued", func() bool { return queueLen(t, admin, b, k) == 1 })
	if err := admin.Del(ctx, b.LockName(k)).Err(); err != nil {
		t.Fatal(err)
	}
	taker, err := newClient(t, newRDB(t, srv.Addr())).TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire of a lock deleted under a FIFO waiter: %v", err)
	}
	waitFor(t, 5*time.Second, "the waiter's heartbeat to mark the lock", func() bool {
		v, ok := readLock(t, admin, b, k)
		return ok && strings.Contains(v.Flags, "q")
	})
	if err := taker.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := w.lease(t, 5*time.Second, "FIFO waiter")
	if l.Fence() <= taker.Fence() {
		t.Fatalf("waiter's fence %d, want > %d", l.Fence(), taker.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release by the deleted holder: got %v, want ErrNotHeld", err)
	}
}

// TestFIFOReentrant: an owner holding the lock re-enters at once with
// WithFIFO too, with the same fence.
func TestFIFOReentrant(t *testing.T) {
	c := newClient(t, newRDB(t, srv.Addr()), dlock.WithOwner("fifo-owner"), dlock.WithFIFO())
	ctx := ctxT(t, 10*time.Second)
	k := key(t)
	l1, err := c.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Fence() != l1.Fence() || l2.Count() != 2 {
		t.Fatalf("nested FIFO acquire: got fence %d count %d, want fence %d count 2", l2.Fence(), l2.Count(), l1.Fence())
	}
	if err := errors.Join(l2.Release(ctx), l1.Release(ctx)); err != nil {
		t.Fatal(err)
	}
}

// TestFIFOHeartbeatsOnly counts a queued waiter's requests while the
// holder keeps the lock for a second: only its heartbeats (one per
// WaiterTTL/4), no polling for the lock.
func TestFIFOHeartbeatsOnly(t *testing.T) {
	const hold = time.Second
	ttl := redislock.DefaultWaiterTTL
	hook := &tripHook{}
	rdb := newRDB(t, srv.Addr())
	rdb.AddHook(hook)
	c := newClient(t, rdb)
	holder := newClient(t, newRDB(t, srv.Addr()))
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	// Warm up: connections dialled (HELLO, CLIENT SETINFO), scripts loaded,
	// the wake channel subscribed.
	warm, err := c.Acquire(ctx, k+".warm-up", dlock.WithFIFO())
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	hook.start()
	w := startAcquire(c, ctx, k, dlock.WithFIFO())
	time.Sleep(hold) // the quantity measured: requests during a wait of this length
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := w.lease(t, 5*time.Second, "waiter")
	trips := hook.stop()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Join + heartbeats; the hand-off message needs no claim request.
	want := 1 + int(hold/(ttl/4))
	t.Logf("requests of a FIFO waiter during a %v wait: %d (join, heartbeats every %v)", hold, len(trips), ttl/4)
	if len(trips) > want+1 {
		t.Fatalf("requests during a %v wait: got %d, want about %d (join, heartbeats)", hold, len(trips), want)
	}
}

// TestFIFOLongWait: a FIFO waiter with a short TTL waits much longer than
// the TTL; the lease it gets still has most of its validity (its lifetime
// counts from its last heartbeat before the hand-off, or from the claim:
// Grant.Since), and the watchdog keeps it.
func TestFIFOLongWait(t *testing.T) {
	const ttl = 300 * time.Millisecond
	holder := newClient(t, newRDB(t, srv.Addr()))
	c := newClient(t, newRDB(t, srv.Addr()), dlock.WithTTL(ttl))
	ctx := ctxT(t, 10*time.Second)
	k := key(t)
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	w := startAcquire(c, ctx, k, dlock.WithFIFO())
	time.Sleep(3 * ttl) // the quantity under test: a wait of 3 TTLs
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := w.lease(t, 5*time.Second, "waiter")
	if left := time.Until(l.Expires()); left < ttl/3 {
		t.Fatalf("lease after a wait of 3 TTLs: expires in %v, want about the TTL %v", left, ttl)
	}
	select {
	case <-l.Done():
		t.Fatalf("lease lost: %v", l.Err())
	case <-time.After(3 * ttl):
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFIFOSurvivesReconnect kills the waiter Backend's pub/sub connection
// on the server while it waits, then releases: the hand-off message may be
// lost, but the waiter is woken when its wake channel is subscribed again
// and is served promptly, not at its next heartbeat (2.5s here).
func TestFIFOSurvivesReconnect(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	opt := redislock.WithWaiterTTL(10 * time.Second)
	holder := newClient(t, newRDB(t, srv.Addr()))
	wrdb := newRDB(t, srv.Addr())
	for i := 0; i < 3; i++ {
		h, err := holder.Acquire(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		w := startAcquire(dlockClient(t, wrdb, opt), ctx, k, dlock.WithFIFO())
		waitFor(t, 5*time.Second, "the waiter queued", func() bool { return queueLen(t, admin, b, k) == 1 })
		if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
			t.Fatalf("CLIENT KILL TYPE pubsub: %v", err)
		}
		// Release at once, while the subscription is most likely down.
		released := time.Now()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := w.lease(t, 5*time.Second, "waiter")
		d := time.Since(released)
		t.Logf("round %d: served %v after the release", i, d)
		if d > time.Second {
			t.Fatalf("round %d: waiter served %v after the release, want well before its 2.5s heartbeat", i, d)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFIFOCloseWhileWaiting closes the waiter's Backend during the wait:
// the wait ends with ErrClosed and the waiter leaves the queue.
func TestFIFOCloseWhileWaiting(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	holder := newClient(t, newRDB(t, srv.Addr()))
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	wb := redislock.New(newRDB(t, srv.Addr()))
	c := dlock.New(wb)
	w := startAcquire(c, ctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the waiter queued", func() bool { return queueLen(t, admin, b, k) == 1 })
	if err := wb.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-w.errc:
		if !errors.Is(err, dlock.ErrClosed) {
			t.Fatalf("wait on a closed Backend: got %v, want ErrClosed", err)
		}
	case <-w.got:
		t.Fatal("acquired on a closed Backend")
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not end when its Backend closed")
	}
	if q := queueLen(t, admin, b, k); q != 0 {
		t.Fatalf("queue after the closed waiter returned: got %d entries, want 0", q)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFIFOHandOffWithoutClaim: a waiter handed the lock holds it from the
// hand-off message on, with no request of its own. Its lease does not
// outlive the server's reservation (the claim TTL); with auto-renew the
// first renewal, a third of the claim TTL after the waiter's last step,
// confirms it with the lease TTL; without auto-renew Acquire confirms it
// with one request before it returns.
func TestFIFOHandOffWithoutClaim(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	// Claim TTL 3s: heartbeats every 750ms, none between the join and the
	// hand-off below.
	opt := redislock.WithWaiterTTL(3 * time.Second)
	for _, autoRenew := range []bool{true, false} {
		t.Run(fmt.Sprintf("autoRenew=%v", autoRenew), func(t *testing.T) {
			ctx := ctxT(t, 30*time.Second)
			k := key(t)
			holder := dlockClient(t, newRDB(t, srv.Addr()), opt)
			h, err := holder.Acquire(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			hook := &countHook{}
			rdb := newRDB(t, srv.Addr())
			rdb.AddHook(hook)
			wb := redislock.New(rdb, opt)
			c := dlock.New(wb, dlock.WithTTL(time.Minute), dlock.WithAutoRenew(autoRenew))
			t.Cleanup(func() { c.Close() })
			w := startAcquire(c, ctx, k, dlock.WithFIFO())
			waitFor(t, 5*time.Second, "the waiter queued", func() bool { return queueLen(t, admin, b, k) == 1 })
			before := hook.n.Load()
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			l := w.lease(t, 5*time.Second, "waiter")
			sent := hook.n.Load() - before
			t0 := time.Now()
			info, err := b.Inspect(ctx, k)
			if err != nil || info.Owner != l.Owner() || info.Fence != l.Fence() {
				t.Fatalf("lock on the server: got %+v, %v, want owner %q fence %d", info, err, l.Owner(), l.Fence())
			}
			if exp, limit := l.Expires(), t0.Add(info.TTL+time.Millisecond); exp.After(limit) {
				t.Fatalf("lease expires %v after the server's expiry (TTL %v)", exp.Sub(limit), info.TTL)
			}
			if !autoRenew {
				if sent != 1 || info.TTL < 50*time.Second {
					t.Fatalf("without auto-renew: got %d requests from the hand-off to Acquire's return and a server TTL %v, want 1 (the confirming refresh) and the lease TTL 1m", sent, info.TTL)
				}
			} else {
				if sent != 0 || info.TTL > 3*time.Second {
					t.Fatalf("with auto-renew: got %d requests from the hand-off to Acquire's return and a server TTL %v, want 0 and the claim TTL 3s", sent, info.TTL)
				}
				if left := time.Until(l.Expires()); left < time.Second {
					t.Fatalf("lease right after the hand-off expires in %v, want most of the claim TTL 3s", left)
				}
				waitFor(t, 5*time.Second, "the first renewal: the lease TTL on the server", func() bool {
					info, err := b.Inspect(ctx, k)
					return err == nil && info.Owner == l.Owner() && info.TTL > 50*time.Second
				})
				waitFor(t, 5*time.Second, "the lease's Expires a minute ahead", func() bool {
					return time.Until(l.Expires()) > 50*time.Second
				})
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if info, err := b.Inspect(ctx, k); err != nil || info.Held {
				t.Fatalf("lock after the release: got %+v, %v, want free", info, err)
			}
		})
	}
}

// TestFIFOHandOffReleasedBeforeRenewal: a waiter handed the lock releases
// it before any renewal (the lock still carries the claim field and the
// claim TTL): the release frees it, or hands it to the next waiter, which
// holds it in turn.
func TestFIFOHandOffReleasedBeforeRenewal(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, admin)
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	opt := redislock.WithWaiterTTL(3 * time.Second)
	holder := dlockClient(t, newRDB(t, srv.Addr()), opt)
	h, err := holder.Acquire(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	first := startAcquire(dlockClient(t, newRDB(t, srv.Addr()), opt), ctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the first waiter queued", func() bool { return queueLen(t, admin, b, k) == 1 })
	second := startAcquire(dlockClient(t, newRDB(t, srv.Addr()), opt), ctx, k, dlock.WithFIFO())
	waitFor(t, 5*time.Second, "the second waiter queued", func() bool { return queueLen(t, admin, b, k) == 2 })
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l1 := first.lease(t, 5*time.Second, "first waiter")
	if err := l1.Release(ctx); err != nil {
		t.Fatalf("release of a hand-off before its first renewal: %v", err)
	}
	l2 := second.lease(t, 5*time.Second, "second waiter")
	if l2.Fence() <= l1.Fence() || l1.Fence() <= h.Fence() {
		t.Fatalf("fences: holder %d, first %d, second %d, want increasing", h.Fence(), l1.Fence(), l2.Fence())
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := b.Inspect(ctx, k); err != nil || info.Held || info.Waiters != 0 {
		t.Fatalf("lock after the last release: got %+v, %v, want free, no waiters", info, err)
	}
}
