package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
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
	<-l.Done() // holds the lock until killed (or the lease is lost)
	return 0
}

// queueLen returns the number of entries in key's FIFO queue.
func queueLen(t testing.TB, rdb redis.Cmdable, b *redislock.Backend, key string) int64 {
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

	state func() string // the key's state, for a timeout's message; nil: none
}

// stateNote returns w.state's report as a suffix of a failure message.
func (w *waiter) stateNote() string {
	if w.state == nil {
		return ""
	}
	return "; " + w.state()
}

// startAcquire starts an Acquire of key through c with ctx and opts on a
// goroutine of its own.
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
		t.Fatalf("%s: not acquired within %v%s", what, d, w.stateNote())
	}
	return nil
}

// failure returns the waiter's error, failing the test if it acquired
// or did not return within 5s.
func (w *waiter) failure(t *testing.T, what string) error {
	t.Helper()
	select {
	case err := <-w.errc:
		return err
	case l := <-w.got:
		t.Fatalf("%s: acquired (fence %d), want an error", what, l.Fence())
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: did not return within 5s%s", what, w.stateNote())
	}
	return nil
}

// heldKey is a key held by a Client of its own, with an admin connection
// and a Backend that look at its lock and queue.
type heldKey struct {
	admin redis.UniversalClient
	b     *redislock.Backend
	ctx   context.Context // ends 30s after the start
	key   string
	h     *dlock.Lease // the holder's lease
}

// holdKey acquires a fresh key with opts through holder, or through a
// new Client with default options when holder is nil.
func holdKey(t *testing.T, holder *dlock.Client, opts ...dlock.Option) *heldKey {
	t.Helper()
	if holder == nil {
		holder = peer(t)
	}
	return holdKeyOn(t, newRDB(t, srv.Addr()), holder, key(t), opts...)
}

// holdKeyOn acquires k with opts through holder, on the deployment that
// admin connects to.
func holdKeyOn(t *testing.T, admin redis.UniversalClient, holder *dlock.Client, k string, opts ...dlock.Option) *heldKey {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	return &heldKey{admin, newBackend(t, admin), ctx, k, mustAcquire(t, ctx, holder, k, opts...)}
}

// queue starts an Acquire of the key through c with ctx and opts, and
// returns it once the key's queue has n entries.
func (s *heldKey) queue(t *testing.T, c *dlock.Client, ctx context.Context, n int64, opts ...dlock.Option) *waiter {
	t.Helper()
	w := startAcquire(c, ctx, s.key, opts...)
	w.state = s.state
	s.queued(t, n)
	return w
}

// state reports the key's lock value and queue, as the server holds them.
func (s *heldKey) state() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	lock := s.b.LockName(s.key)
	v, err := s.admin.Get(ctx, lock).Result()
	q, qerr := s.admin.ZRange(ctx, lock+":q", 0, -1).Result()
	beats := make([]string, len(q)) // each member's heartbeat PTTL
	for i, m := range q {
		beats[i] = s.admin.PTTL(ctx, lock+":w:"+m).Val().String()
	}
	return fmt.Sprintf("lock %q (%v), queue %q (%v), heartbeats %v", v, err, q, qerr, beats)
}

// queued waits until the key's queue has n entries.
func (s *heldKey) queued(t *testing.T, n int64) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d entries in the queue", n), func() bool {
		return queueLen(t, s.admin, s.b, s.key) == n
	})
}

// handOff queues an Acquire through c with opts behind the holder,
// releases the holder's lease, and returns the waiter's lease and how
// long after the release it was granted.
func (s *heldKey) handOff(t *testing.T, c *dlock.Client, opts ...dlock.Option) (*dlock.Lease, time.Duration) {
	t.Helper()
	w := s.queue(t, c, s.ctx, 1, opts...)
	released := s.release(t)
	l := w.lease(t, 5*time.Second, "waiter")
	return l, time.Since(released)
}

// release releases the holder's lease and returns when it began.
func (s *heldKey) release(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	release(t, s.ctx, s.h)
	return at
}

// handedOver checks that the server holds the key for l (its owner and
// fence) and that l does not outlive the server's deadline, and returns
// the server's view of the lock.
func (s *heldKey) handedOver(t *testing.T, l *dlock.Lease) dlock.Info {
	t.Helper()
	t0 := time.Now()
	info, err := s.b.Inspect(s.ctx, s.key)
	if err != nil || info.Owner != l.Owner() || info.Fence != l.Fence() {
		t.Fatalf("lock on the server: got %+v, %v, want owner %q fence %d", info, err, l.Owner(), l.Fence())
	}
	// The server's expiry is at least t0 + its PTTL (ms, rounded down).
	if exp, limit := l.Expires(), t0.Add(info.TTL+time.Millisecond); exp.After(limit) {
		t.Fatalf("lease expires %v after the server's expiry (TTL %v)", exp.Sub(limit), info.TTL)
	}
	return info
}

// renewedToMinute waits for the first renewal of l, a lease of TTL 1m:
// the lock's TTL on the server and l's Expires then lie 50s ahead or more.
func (s *heldKey) renewedToMinute(t *testing.T, l *dlock.Lease) {
	t.Helper()
	waitFor(t, 5*time.Second, "the lease TTL on the server (the first renewal)", func() bool {
		info, err := s.b.Inspect(s.ctx, s.key)
		return err == nil && info.Owner == l.Owner() && info.TTL > 50*time.Second
	})
	waitFor(t, 5*time.Second, "the lease's Expires a minute ahead", func() bool {
		return time.Until(l.Expires()) > 50*time.Second
	})
}

// free fails the test if the key is held or has waiters.
func (s *heldKey) free(t *testing.T) {
	t.Helper()
	if info, err := s.b.Inspect(s.ctx, s.key); err != nil || info.Held || info.Waiters != 0 {
		t.Fatalf("lock after the last release: got %+v, %v, want free, no waiters", info, err)
	}
}

// TestFIFOOrder queues eight waiters, each with its own Client and
// connection (as eight processes would), one after the other, and checks
// that they are served exactly in arrival order, with increasing fences,
// and that each release is PUBLISHed once, to the next waiter only.
func TestFIFOOrder(t *testing.T) {
	const n = 8
	s := holdKey(t, nil)
	var (
		mu    sync.Mutex
		order []int
	)
	done := make(chan error, n)
	for i := 0; i < n; i++ {
		c := peer(t)
		go func() {
			l, err := c.Acquire(s.ctx, s.key, dlock.WithFIFO())
			if err != nil {
				done <- err
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			done <- l.Release(s.ctx)
		}()
		// The next waiter starts once this one is in the queue.
		s.queued(t, int64(i+1))
	}
	if info, err := s.b.Inspect(s.ctx, s.key); err != nil || info.Waiters != n {
		t.Fatalf("Inspect: got %+v, %v, want %d waiters", info, err, n)
	}
	published := cmdCalls(t, s.admin, "publish")
	s.release(t)
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
	if p := cmdCalls(t, s.admin, "publish") - published; p != n {
		t.Fatalf("PUBLISH calls for %d hand-offs: got %d, want %d (one per release, to the next waiter only)", n, p, n)
	}
	s.free(t)
}

// TestFIFOFences checks that hand-offs issue increasing fences, that the
// woken waiter owns the lock once Acquire returns, with a lease that does
// not outlive the server's reservation, and that its first renewal gives
// the lock the lease TTL.
func TestFIFOFences(t *testing.T) {
	a := peer(t, dlock.WithTTL(time.Minute))
	c := peer(t, dlock.WithTTL(time.Minute))
	s := holdKey(t, a, dlock.WithFIFO())
	last := s.h
	for i := 0; i < 5; i++ {
		next := a
		if i%2 == 0 {
			next = c
		}
		w := s.queue(t, next, s.ctx, 1, dlock.WithFIFO())
		release(t, s.ctx, last)
		l := w.lease(t, 5*time.Second, "waiter")
		if l.Fence() <= last.Fence() {
			t.Fatalf("hand-off %d: fence got %d, want > %d", i, l.Fence(), last.Fence())
		}
		s.handedOver(t, l)
		s.renewedToMinute(t, l)
		last = l
	}
	release(t, s.ctx, last)
}

// TestFIFOCancelLeavesQueue cancels a queued waiter: its entry is gone at
// once (not after the waiter TTL), and the waiter behind it is served by
// the next release.
func TestFIFOCancelLeavesQueue(t *testing.T) {
	s := holdKey(t, nil)
	// A waiter TTL of 10s: a cancelled entry left behind would be visible.
	opt := redislock.WithWaiterTTL(10 * time.Second)
	cctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	first := s.queue(t, peerWith(t, opt), cctx, 1, dlock.WithFIFO())
	second := s.queue(t, peerWith(t, opt), s.ctx, 2, dlock.WithFIFO())
	cancel()
	start := time.Now()
	if err := first.failure(t, "cancelled waiter"); !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: got %v, want ErrNotAcquired and context.Canceled", err)
	}
	// Acquire returns after the cleanup: the entry is gone already.
	if q := queueLen(t, s.admin, s.b, s.key); q != 1 {
		t.Fatalf("queue right after the cancelled Acquire returned: got %d entries, want 1", q)
	}
	t.Logf("cancelled waiter returned and left the queue in %v", time.Since(start))
	if info, err := s.b.Inspect(s.ctx, s.key); err != nil || info.Waiters != 1 {
		t.Fatalf("Inspect: got %+v, %v, want 1 waiter", info, err)
	}
	released := s.release(t)
	l := second.lease(t, 5*time.Second, "second waiter")
	if d := time.Since(released); d > time.Second {
		t.Fatalf("second waiter served %v after the release, want promptly", d)
	}
	release(t, s.ctx, l)
}

// cancelHook fails the first script a waiter sends after it is armed
// (the claim of a lock handed to it) and cancels the waiter's context,
// as if the context ended just as the hand-off arrived.
type cancelHook struct {
	mu     sync.Mutex
	armed  bool
	cancel func()
}

func (h *cancelHook) arm() {
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

// fire is the hook (a hookFunc): it drops the first single script
// command after arm.
func (h *cancelHook) fire(cmds []redis.Cmder, pipe bool) error {
	h.mu.Lock()
	fire := h.armed && !pipe && (cmds[0].Name() == "evalsha" || cmds[0].Name() == "eval")
	if fire {
		h.armed = false
	}
	h.mu.Unlock()
	if !fire {
		return nil
	}
	h.cancel()
	return errors.New("test: claim dropped")
}

// TestFIFOCancelAfterHandOff: the lock is handed to a waiter whose
// context ends before it claims it. The waiter passes it on to the next
// one at once, not after the claim TTL (10s here). The waiter is
// reentrant (WithOwner), so it claims the hand-off with a request, which
// the hook fails while cancelling its context.
func TestFIFOCancelAfterHandOff(t *testing.T) {
	opt := redislock.WithWaiterTTL(10 * time.Second)
	s := holdKey(t, peerWith(t, opt))
	cctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	testCancelAfterHandOff(t, s, cancel, func(rdbA *redis.Client) *waiter {
		return startAcquire(dlockClient(t, rdbA, opt, redislock.WithClientPool()), cctx, s.key, dlock.WithFIFO(), dlock.WithOwner("first"))
	})
}

// endsLate is a context that ends (Err reports context.Canceled) when
// end is called, but whose Done channel is its parent's: a wait on it sees
// a call's error before the end, as when a deadline passes just after a
// call failed.
type endsLate struct {
	context.Context
	ended atomic.Bool
}

func (c *endsLate) end() { c.ended.Store(true) }

func (c *endsLate) Err() error {
	if c.ended.Load() {
		return context.Canceled
	}
	return c.Context.Err()
}

// TestFIFOStepFailsAsContextEnds is TestFIFOCancelAfterHandOff with the
// claim failing just before the waiter's context ends, so that Wait sees
// the failure first: Wait returns at once, not after the waiter TTL.
// (A Client's Wait runs on a context of its own: this calls
// Backend.Wait.)
func TestFIFOStepFailsAsContextEnds(t *testing.T) {
	opt := redislock.WithWaiterTTL(10 * time.Second)
	s := holdKey(t, peerWith(t, opt))
	ctx := &endsLate{Context: s.ctx}
	testCancelAfterHandOff(t, s, ctx.end, func(rdbA *redis.Client) *waiter {
		b := locktest.Closing(t, redislock.New(rdbA, opt, redislock.WithClientPool()))
		w := &waiter{got: make(chan *dlock.Lease, 1), errc: make(chan error, 1)}
		go func() {
			r := dlock.Request{Key: s.key, Token: "first", TTL: 30 * time.Second, Reentrant: true, FIFO: true}
			g, err := b.Wait(ctx, r)
			if err == nil {
				err = fmt.Errorf("granted (fence %d)", g.Fence)
			}
			w.errc <- err
		}()
		return w
	})
}

// testCancelAfterHandOff queues the waiter start returns, on a connection
// whose first script after the release fails and calls end (start's
// Backend must use WithClientPool, for the hook to see it), then another
// waiter; it releases the lock and checks that the first returns an error
// matching context.Canceled, and the second is served at once.
func testCancelAfterHandOff(t *testing.T, s *heldKey, end func(), start func(*redis.Client) *waiter) {
	hook := &cancelHook{cancel: end}
	rdbA := newRDB(t, srv.Addr())
	rdbA.AddHook(hookFunc(hook.fire))
	first := start(rdbA)
	first.state = s.state
	s.queued(t, 1)
	second := s.queue(t, peerWith(t, redislock.WithWaiterTTL(10*time.Second)), s.ctx, 2, dlock.WithFIFO())
	hook.arm()
	released := s.release(t)
	if err := first.failure(t, "first waiter, its context cancelled before the claim"); !errors.Is(err, context.Canceled) {
		t.Fatalf("first waiter: got %v, want context.Canceled", err)
	}
	l := second.lease(t, 5*time.Second, "second waiter")
	d := time.Since(released)
	t.Logf("second waiter served %v after the release", d)
	if d > 2*time.Second {
		t.Fatalf("second waiter served %v after the release, want at once (the claim TTL is 10s)", d)
	}
	if l.Fence() <= s.h.Fence() {
		t.Fatalf("second waiter's fence: got %d, want > %d", l.Fence(), s.h.Fence())
	}
	release(t, s.ctx, l)
	s.queued(t, 0)
	s.free(t)
}

// errReplyLost is the error loseReply gives a command it ran.
var errReplyLost = errors.New("test: reply lost")

// loseReply is a go-redis hook: once armed, it fails the next single
// script command that the server ran with errReplyLost, as a connection
// that broke after the server ran it.
type loseReply struct{ armed atomic.Bool }

func (h *loseReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *loseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && h.armed.CompareAndSwap(true, false) {
			cmd.SetErr(errReplyLost)
			return errReplyLost
		}
		return err
	}
}

func (h *loseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFIFOStepReplyLost: the first step of a FIFO wait queued the waiter,
// but its reply was lost. Wait fails and takes the entry out of the
// queue, so that the next waiter is served at once when the lock is
// released: a dead entry at the head would hold the hand-off for the
// waiter TTL (10s here).
func TestFIFOStepReplyLost(t *testing.T) {
	opt := redislock.WithWaiterTTL(10 * time.Second)
	s := holdKey(t, peerWith(t, opt))
	rdbA := newRDB(t, srv.Addr())
	hook := &loseReply{}
	rdbA.AddHook(hook)
	b := locktest.Closing(t, redislock.New(rdbA, opt, redislock.WithClientPool()))
	hook.armed.Store(true)
	r := dlock.Request{Key: s.key, Token: "first", TTL: 30 * time.Second, FIFO: true}
	if g, err := b.Wait(s.ctx, r); !errors.Is(err, errReplyLost) {
		t.Fatalf("Wait whose first step's reply was lost: got %+v, %v; want errReplyLost", g, err)
	}
	if n := queueLen(t, s.admin, s.b, s.key); n != 0 {
		t.Fatalf("queue after the failed Wait: %d entries, want 0; %s", n, s.state())
	}
	second := s.queue(t, peerWith(t, opt), s.ctx, 1, dlock.WithFIFO())
	released := s.release(t)
	l := second.lease(t, 5*time.Second, "second waiter")
	t.Logf("second waiter served %v after the release", time.Since(released))
	release(t, s.ctx, l)
	s.free(t)
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
	s := holdKey(t, nil)

	// The waiter process: this test binary again, in helper mode.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+srv.Addr()+" "+s.key)
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
	waitFor(t, 10*time.Second, "the waiter process queued", func() bool { return queueLen(t, s.admin, s.b, s.key) == 1 })
	w := s.queue(t, peer(t), s.ctx, 2, dlock.WithFIFO())

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	released := s.release(t)
	l := w.lease(t, 10*time.Second, "the waiter behind the killed one")
	d := time.Since(released)
	t.Logf("waiter served %v after the release (bound: waiter TTL %v + %v + slack = %v)", d, ttl, ttl/4, bound)
	if d > bound {
		t.Fatalf("a killed waiter at the head delayed the next one by %v, want at most %v", d, bound)
	}
	if d < ttl/2 {
		t.Fatalf("served %v after the release: the lock was not handed to the killed waiter first, the test tests nothing", d)
	}
	if l.Fence() <= s.h.Fence() {
		t.Fatalf("fence: got %d, want > %d", l.Fence(), s.h.Fence())
	}
	release(t, s.ctx, l)
}

// TestFIFODeadWaiterSkipped: a waiter whose heartbeat is older than the
// waiter TTL when the lock is released is skipped at once: the next one
// is served without delay.
func TestFIFODeadWaiterSkipped(t *testing.T) {
	s := holdKey(t, nil)
	lock := s.b.LockName(s.key)
	// A dead waiter's entries, as a process killed long ago leaves them:
	// queued first, heartbeat deadline in the past.
	member := strings.Repeat("D", 26) + "dead-token"
	s.admin.ZAdd(s.ctx, lock+":q", redis.Z{Score: 0.5, Member: member})
	s.admin.ZAdd(s.ctx, lock+":hb", redis.Z{Score: 1, Member: member})
	w := s.queue(t, peer(t), s.ctx, 2, dlock.WithFIFO())
	released := s.release(t)
	l := w.lease(t, 5*time.Second, "live waiter")
	if d := time.Since(released); d > 200*time.Millisecond {
		t.Fatalf("live waiter behind a dead one served %v after the release, want at once", d)
	}
	release(t, s.ctx, l)
	if q := queueLen(t, s.admin, s.b, s.key); q != 0 {
		t.Fatalf("queue: got %d entries, want 0 (the dead one dropped)", q)
	}
}

// TestFIFOHolderExpires: the holder never releases (no renewal); the
// first FIFO waiter takes the lock right after its TTL runs out (expiry
// publishes nothing: the first waiter schedules a check at the holder's
// remaining TTL).
func TestFIFOHolderExpires(t *testing.T) {
	const ttl = 300 * time.Millisecond
	s := holdKey(t, peer(t, dlock.WithTTL(ttl), dlock.WithAutoRenew(false)))
	start := time.Now()
	l := mustAcquire(t, s.ctx, peer(t), s.key, dlock.WithFIFO())
	d := time.Since(start)
	t.Logf("FIFO waiter acquired %v after the holder (TTL %v)", d, ttl)
	if d > ttl+200*time.Millisecond {
		t.Fatalf("FIFO waiter acquired %v after the holder, want right after its TTL %v (< +200ms)", d, ttl)
	}
	if l.Fence() <= s.h.Fence() {
		t.Fatalf("fence: got %d, want > %d", l.Fence(), s.h.Fence())
	}
	release(t, s.ctx, l)
}

// TestFIFONotOvertaken: a lock that freed itself without a release (DEL,
// as an expiry would) while a FIFO waiter is queued may be taken by a
// TryAcquire, which does not read the queue; the waiter's next heartbeat
// marks the new holder's lock, and its release hands it to the waiter.
func TestFIFONotOvertaken(t *testing.T) {
	s := holdKey(t, peer(t, dlock.WithTTL(time.Minute)))
	w := s.queue(t, peerWith(t), s.ctx, 1, dlock.WithFIFO())
	if err := s.admin.Del(s.ctx, s.b.LockName(s.key)).Err(); err != nil {
		t.Fatal(err)
	}
	taker, err := peer(t).TryAcquire(s.ctx, s.key)
	if err != nil {
		t.Fatalf("TryAcquire of a lock deleted under a FIFO waiter: %v", err)
	}
	waitFor(t, 5*time.Second, "the waiter's heartbeat to mark the lock", func() bool {
		v, ok := readLock(t, s.admin, s.b, s.key)
		return ok && strings.Contains(v.Flags, "q")
	})
	release(t, s.ctx, taker)
	l := w.lease(t, 5*time.Second, "FIFO waiter")
	if l.Fence() <= taker.Fence() {
		t.Fatalf("waiter's fence %d, want > %d", l.Fence(), taker.Fence())
	}
	release(t, s.ctx, l)
	if err := s.h.Release(s.ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release by the deleted holder: got %v, want ErrNotHeld", err)
	}
}

// TestFIFOReentrant: an owner holding the lock re-enters at once with
// WithFIFO too, with the same fence.
func TestFIFOReentrant(t *testing.T) {
	c := peer(t, dlock.WithOwner("fifo-owner"), dlock.WithFIFO())
	ctx := ctxT(t, 10*time.Second)
	k := key(t)
	l1 := mustAcquire(t, ctx, c, k)
	l2 := mustAcquire(t, ctx, c, k)
	if l2.Fence() != l1.Fence() || l2.Count() != 2 {
		t.Fatalf("nested FIFO acquire: got fence %d count %d, want fence %d count 2", l2.Fence(), l2.Count(), l1.Fence())
	}
	release(t, ctx, l2, l1)
}

// TestFIFOHeartbeatsOnly counts a queued waiter's requests while the
// holder keeps the lock: only its join and heartbeats (one per
// WaiterTTL/4), no polling for the lock, and no claim of the hand-off. It
// awaits the join and ten heartbeats instead of waiting a set time, and
// allows as many requests as the elapsed time has heartbeat periods, plus
// the join and one more, at that point and once the waiter holds the lock.
func TestFIFOHeartbeatsOnly(t *testing.T) {
	const beats = 10
	period := redislock.DefaultWaiterTTL / 4
	hook := &tripHook{}
	rdb := newRDB(t, srv.Addr())
	rdb.AddHook(hookFunc(hook.add))
	c := dlockClient(t, rdb, redislock.WithClientPool())
	s := holdKey(t, nil)
	// Warm up: connections dialled (HELLO, CLIENT SETINFO), scripts loaded,
	// the wake channel subscribed.
	release(t, s.ctx, mustAcquire(t, s.ctx, c, s.key+".warm-up", dlock.WithFIFO()))
	hook.start()
	start := time.Now()
	w := startAcquire(c, s.ctx, s.key, dlock.WithFIFO())
	atMost := func(what string, n int) {
		t.Helper()
		took := time.Since(start)
		t.Logf("%s: %d requests in %v (join, heartbeats every %v)", what, n, took, period)
		if limit := 2 + int(took/period); n > limit {
			t.Fatalf("%s: got %d requests in %v, want at most %d (join, one heartbeat per %v, one more)", what, n, took, limit, period)
		}
	}
	waitFor(t, 10*time.Second+beats*period, "the waiter's join and heartbeats", func() bool { return hook.count() >= 1+beats })
	atMost("waiting", hook.count())
	s.release(t)
	l := w.lease(t, 5*time.Second, "waiter")
	// The hand-off message needs no claim request.
	atMost("up to the hand-off", hook.count())
	hook.stop()
	release(t, s.ctx, l)
}

// TestFIFOLongWait: a FIFO waiter with a short TTL waits much longer than
// the TTL (its join and ten heartbeats, one per WaiterTTL/4); the lease it
// gets still has most of its validity (its lifetime counts from its last
// heartbeat before the hand-off, or from the claim: Grant.Since), and the
// watchdog keeps it.
func TestFIFOLongWait(t *testing.T) {
	const ttl, beats = 300 * time.Millisecond, 10
	if beats*redislock.DefaultWaiterTTL/4 < 3*ttl {
		t.Fatalf("%d heartbeats are shorter than 3 TTLs", beats)
	}
	hook := &tripHook{}
	rdb := newRDB(t, srv.Addr())
	rdb.AddHook(hookFunc(hook.add))
	c := locktest.Closing(t, dlock.New(redislock.New(rdb, redislock.WithClientPool()), dlock.WithTTL(ttl)))
	s := holdKey(t, nil)
	release(t, s.ctx, mustAcquire(t, s.ctx, c, s.key+".warm-up", dlock.WithFIFO()))
	hook.start()
	w := startAcquire(c, s.ctx, s.key, dlock.WithFIFO())
	waitFor(t, 10*time.Second, "the waiter's join and heartbeats", func() bool { return hook.count() >= 1+beats })
	hook.stop()
	s.release(t)
	l := w.lease(t, 5*time.Second, "waiter")
	if left := time.Until(l.Expires()); left < ttl/3 {
		t.Fatalf("lease after a wait of 3 TTLs: expires in %v, want about the TTL %v", left, ttl)
	}
	select {
	case <-l.Done():
		t.Fatalf("lease lost: %v", l.Err())
	case <-time.After(3 * ttl):
	}
	release(t, s.ctx, l)
}

// TestFIFOSurvivesReconnect kills the waiter Backend's pub/sub connection
// on the server while it waits, then releases: the hand-off message may be
// lost, but the waiter is woken when its wake channel is subscribed again
// and is served promptly, not at its next heartbeat (2.5s here).
func TestFIFOSurvivesReconnect(t *testing.T) {
	holder := peer(t)
	wrdb := newRDB(t, srv.Addr())
	s := holdKey(t, holder)
	for i := 0; i < 3; i++ {
		if i > 0 {
			s.h = mustAcquire(t, s.ctx, holder, s.key)
		}
		w := s.queue(t, dlockClient(t, wrdb, redislock.WithWaiterTTL(10*time.Second)), s.ctx, 1, dlock.WithFIFO())
		if err := s.admin.ClientKillByFilter(s.ctx, "TYPE", "pubsub").Err(); err != nil {
			t.Fatalf("CLIENT KILL TYPE pubsub: %v", err)
		}
		// Release at once, while the subscription is most likely down.
		released := s.release(t)
		l := w.lease(t, 5*time.Second, "waiter")
		d := time.Since(released)
		t.Logf("round %d: served %v after the release", i, d)
		if d > time.Second {
			t.Fatalf("round %d: waiter served %v after the release, want well before its 2.5s heartbeat", i, d)
		}
		release(t, s.ctx, l)
	}
}

// TestFIFOCloseWhileWaiting closes the waiter's Backend during the wait:
// the wait ends with ErrClosed and the waiter leaves the queue.
func TestFIFOCloseWhileWaiting(t *testing.T) {
	s := holdKey(t, nil)
	wb := redislock.New(newRDB(t, srv.Addr()))
	c := dlock.New(wb)
	w := s.queue(t, c, s.ctx, 1, dlock.WithFIFO())
	if err := wb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.failure(t, "wait on a closed Backend"); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("wait on a closed Backend: got %v, want ErrClosed", err)
	}
	if q := queueLen(t, s.admin, s.b, s.key); q != 0 {
		t.Fatalf("queue after the closed waiter returned: got %d entries, want 0", q)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	s.release(t)
}

// TestFIFOHandOffWithoutClaim: a waiter handed the lock holds it from the
// hand-off message on, with no request of its own. Its lease does not
// outlive the server's reservation (the claim TTL); with auto-renew the
// first renewal, a third of the claim TTL after the waiter's last step,
// confirms it with the lease TTL; without auto-renew Acquire confirms it
// with one request before it returns.
func TestFIFOHandOffWithoutClaim(t *testing.T) {
	// Claim TTL 3s: heartbeats every 750ms, none between the join and the
	// hand-off below.
	opt := redislock.WithWaiterTTL(3 * time.Second)
	for _, autoRenew := range []bool{true, false} {
		t.Run(fmt.Sprintf("autoRenew=%v", autoRenew), func(t *testing.T) {
			s := holdKey(t, peerWith(t, opt))
			var requests atomic.Int64
			rdb := newRDB(t, srv.Addr())
			rdb.AddHook(countHook(&requests))
			c := locktest.Closing(t, dlock.New(redislock.New(rdb, opt, redislock.WithClientPool()), dlock.WithTTL(time.Minute), dlock.WithAutoRenew(autoRenew)))
			w := s.queue(t, c, s.ctx, 1, dlock.WithFIFO())
			before := requests.Load()
			s.release(t)
			l := w.lease(t, 5*time.Second, "waiter")
			sent := requests.Load() - before
			info := s.handedOver(t, l)
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
				s.renewedToMinute(t, l)
			}
			release(t, s.ctx, l)
			s.free(t)
		})
	}
}

// TestFIFOHandOffReleasedBeforeRenewal: a waiter handed the lock releases
// it before any renewal (the lock still carries the claim field and the
// claim TTL): the release frees it, or hands it to the next waiter, which
// holds it in turn.
func TestFIFOHandOffReleasedBeforeRenewal(t *testing.T) {
	opt := redislock.WithWaiterTTL(3 * time.Second)
	s := holdKey(t, peerWith(t, opt))
	first := s.queue(t, peerWith(t, opt), s.ctx, 1, dlock.WithFIFO())
	second := s.queue(t, peerWith(t, opt), s.ctx, 2, dlock.WithFIFO())
	s.release(t)
	l1 := first.lease(t, 5*time.Second, "first waiter")
	if err := l1.Release(s.ctx); err != nil {
		t.Fatalf("release of a hand-off before its first renewal: %v", err)
	}
	l2 := second.lease(t, 5*time.Second, "second waiter")
	if l2.Fence() <= l1.Fence() || l1.Fence() <= s.h.Fence() {
		t.Fatalf("fences: holder %d, first %d, second %d, want increasing", s.h.Fence(), l1.Fence(), l2.Fence())
	}
	release(t, s.ctx, l2)
	s.free(t)
}
