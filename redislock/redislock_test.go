package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

func req(key string, ttl time.Duration) dlock.Request {
	return dlock.Request{Key: key, Token: "tok-" + key, TTL: ttl}
}

func mustGrant(t testing.TB, b *redislock.Backend, r dlock.Request) dlock.Grant {
	t.Helper()
	g, err := b.TryAcquire(ctxT(t, 5*time.Second), r)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", r.Key, err)
	}
	if !g.OK {
		t.Fatalf("TryAcquire(%q): got %+v, want granted", r.Key, g)
	}
	return g
}

// TestKeyLayout checks the names and contents of the keys of one lock.
func TestKeyLayout(t *testing.T) {
	rdb := newRDB(t, srv.Addr())
	b := newBackend(t, rdb, redislock.WithPrefix("app:"))
	k := key(t)
	lock := b.LockName(k)
	if want := "app:{" + k + "}"; lock != want {
		t.Fatalf("LockName: got %q, want %q", lock, want)
	}
	r := req(k, time.Minute)
	g := mustGrant(t, b, r)
	ctx := ctxT(t, 5*time.Second)
	v, ok := readLock(t, rdb, b, k)
	if want := (lockValue{Fence: g.Fence, Count: 1, Token: r.Token}); !ok || v != want {
		t.Fatalf("lock value: got %+v (present %v), want %+v", v, ok, want)
	}
	if pttl := rdb.PTTL(ctx, lock).Val(); pttl <= 0 || pttl > time.Minute {
		t.Fatalf("lock PTTL: got %v, want in (0, 1m]", pttl)
	}
	if n := rdb.Exists(ctx, lock+":fence", lock+":q").Val(); n != 0 {
		t.Fatalf("keys besides the lock: EXISTS got %d, want 0", n)
	}
	// The fence is the server time in µs.
	now := rdb.Time(ctx).Val()
	if d := now.Sub(time.UnixMicro(int64(g.Fence))); d < 0 || d > time.Minute {
		t.Fatalf("fence %d is %v before the server time %v, want a recent server time in µs", g.Fence, d, now)
	}
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("Release: %v", err)
	}
	noLock(t, rdb, b, "after Release", k)
}

// TestReentrant checks the hold count, the shared fence and the TTL
// refresh of nested holds, and that only the last release frees the lock.
func TestReentrant(t *testing.T) {
	rdb, b, ctx := onSrv(t)
	r := req(key(t), time.Second)
	r.Reentrant = true
	first := mustGrant(t, b, r)
	lock := b.LockName(r.Key)
	rdb.PExpire(ctx, lock, 100*time.Millisecond)
	r.TTL = time.Minute
	second := mustGrant(t, b, r)
	if second.Fence != first.Fence || second.Count != 2 {
		t.Fatalf("nested grant: got fence %d count %d, want fence %d count 2", second.Fence, second.Count, first.Fence)
	}
	if pttl := rdb.PTTL(ctx, lock).Val(); pttl < 30*time.Second {
		t.Fatalf("PTTL after a nested grant with TTL 1m: got %v, want it refreshed", pttl)
	}
	other := dlock.Request{Key: r.Key, Token: "someone-else", TTL: time.Second, Reentrant: true}
	if g, err := b.TryAcquire(ctx, other); err != nil || g.OK || g.HolderTTL < 30*time.Second {
		t.Fatalf("TryAcquire by another owner: got %+v, %v, want not granted with HolderTTL ≈ 1m", g, err)
	}
	r.Fence = first.Fence
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("first Release: %v", err)
	}
	if v, _ := readLock(t, rdb, b, r.Key); v.Count != 1 {
		t.Fatalf("count after one release: got %d, want 1", v.Count)
	}
	if err := b.Release(ctx, r); err != nil {
		t.Fatalf("last Release: %v", err)
	}
	noLock(t, rdb, b, "after the last release", r.Key)
	if err := b.Release(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("one release too many: got %v, want ErrNotHeld", err)
	}
}

// TestNotHeldChangesNothing checks that Release and Refresh with a wrong
// token or a wrong fence return ErrNotHeld and leave the lock alone.
func TestNotHeldChangesNothing(t *testing.T) {
	rdb, b, ctx := onSrv(t)
	r := req(key(t), time.Minute)
	g := mustGrant(t, b, r)
	lock := b.LockName(r.Key)
	before := rdb.Get(ctx, lock).Val()
	wrongToken := dlock.Request{Key: r.Key, Token: "intruder", TTL: time.Hour, Fence: g.Fence}
	wrongFence := dlock.Request{Key: r.Key, Token: r.Token, TTL: time.Hour, Fence: g.Fence - 1}
	for _, bad := range []dlock.Request{wrongToken, wrongFence} {
		if err := b.Refresh(ctx, bad); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Refresh(%+v): got %v, want ErrNotHeld", bad, err)
		}
		if err := b.Release(ctx, bad); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Release(%+v): got %v, want ErrNotHeld", bad, err)
		}
	}
	if after := rdb.Get(ctx, lock).Val(); after != before {
		t.Fatalf("lock after refused calls: got %v, want %v", after, before)
	}
	if pttl := rdb.PTTL(ctx, lock).Val(); pttl > time.Minute {
		t.Fatalf("PTTL after a refused Refresh(1h): got %v, want ≤ 1m", pttl)
	}
	// A key nobody holds.
	if err := b.Release(ctx, req(key(t), time.Second)); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Release of a free key: got %v, want ErrNotHeld", err)
	}
}

// TestFenceMonotonic checks that fences strictly increase after the lock
// expires, after DEL of every key of the lock, and after a restart of a
// server without persistence.
func TestFenceMonotonic(t *testing.T) {
	t.Run("AfterExpiry", func(t *testing.T) {
		rdb := newRDB(t, srv.Addr())
		b := newBackend(t, rdb)
		k := key(t)
		last := mustGrant(t, b, req(k, 20*time.Millisecond)).Fence
		for i := 0; i < 5; i++ {
			waitFor(t, 5*time.Second, "the lock to expire", func() bool {
				return rdb.Exists(context.Background(), b.LockName(k)).Val() == 0
			})
			f := mustGrant(t, b, req(k, 20*time.Millisecond)).Fence
			if f <= last {
				t.Fatalf("fence after expiry %d: got %d, want > %d", i, f, last)
			}
			last = f
		}
	})
	t.Run("AfterDel", func(t *testing.T) {
		rdb, b, ctx := onSrv(t)
		k := key(t)
		lock := b.LockName(k)
		var last uint64
		for i := 0; i < 5; i++ {
			f := mustGrant(t, b, req(k, time.Minute)).Fence
			if f <= last {
				t.Fatalf("fence after DEL %d: got %d, want > %d", i, f, last)
			}
			last = f
			if n := rdb.Del(ctx, lock).Val(); n != 1 {
				t.Fatalf("DEL of the lock: got %d, want 1", n)
			}
		}
	})
	t.Run("AfterRestart", func(t *testing.T) {
		rdb := newRDB(t, srv2.Addr())
		b := newBackend(t, rdb)
		k := key(t)
		ctx := ctxT(t, 30*time.Second)
		var last uint64
		for i := 0; i < 3; i++ {
			// Several grants just before the restart push the counter past
			// the clock as far as it can go.
			for j := 0; j < 10; j++ {
				r := req(k, time.Minute)
				f := mustGrant(t, b, r).Fence
				if f <= last {
					t.Fatalf("fence before restart %d: got %d, want > %d", i, f, last)
				}
				last = f
				if err := b.Release(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			if err := srv2.Kill(); err != nil {
				t.Fatal(err)
			}
			if err := srv2.Restart(); err != nil {
				t.Fatal(err)
			}
			if n := rdb.DBSize(ctx).Val(); n != 0 {
				t.Fatalf("DBSIZE after restart without persistence: got %d, want 0", n)
			}
		}
		if f := mustGrant(t, b, req(k, time.Minute)).Fence; f <= last {
			t.Fatalf("fence after restart: got %d, want > %d", f, last)
		}
	})
}

// flushHook counts the scripts sent with EVAL or SCRIPT LOAD (the NOSCRIPT
// fallbacks) and the pipelines; its count is the hook.
type flushHook struct {
	mu        sync.Mutex
	evals     int
	pipelines int
	evalPipes int // pipelines that contained an EVAL
}

// count counts the scripts sent with EVAL or SCRIPT LOAD among cmds, and
// the pipeline (a hookFunc).
func (h *flushHook) count(cmds []redis.Cmder, pipe bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range cmds {
		args := c.Args()
		if c.Name() == "eval" || c.Name() == "script" && len(args) > 1 && args[1] == "load" {
			n++
		}
	}
	h.evals += n
	if pipe {
		h.pipelines++
		if n > 0 {
			h.evalPipes++
		}
	}
	return nil
}

func (h *flushHook) pipes() (all, withEval int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pipelines, h.evalPipes
}
func (h *flushHook) take() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.evals
	h.evals = 0
	return n
}

// TestScriptFlush runs every operation right after SCRIPT FLUSH: each one
// still works, through the EVAL fallback, on the Backend's connection and
// through the client's pool.
func TestScriptFlush(t *testing.T) {
	t.Run("Own", func(t *testing.T) { testScriptFlush(t) })
	t.Run("Pool", func(t *testing.T) { testScriptFlush(t, redislock.WithClientPool()) })
}

func testScriptFlush(t *testing.T, opts ...redislock.Option) {
	rdb := newRDB(t, srv.Addr())
	hook := &flushHook{}
	rdb.AddHook(hookFunc(hook.count))
	b := newBackend(t, rdb, opts...)
	ctx := ctxT(t, 5*time.Second)
	// The EVALs the server ran (the Backend's connection) or the hook saw
	// (the pool).
	var evals int
	flush := func() {
		t.Helper()
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		hook.take()
		evals = cmdCalls(t, rdb, "eval", "script|load")
	}
	usedEval := func(what string) {
		t.Helper()
		if n := hook.take() + cmdCalls(t, rdb, "eval", "script|load") - evals; n == 0 {
			t.Fatalf("%s after SCRIPT FLUSH: no EVAL or SCRIPT LOAD sent, want the NOSCRIPT fallback", what)
		}
	}
	r1, r2 := req(key(t), time.Second), req(key(t), time.Second)

	flush()
	g1 := mustGrant(t, b, r1)
	usedEval("TryAcquire")
	r1.Fence = g1.Fence
	r2.Fence = mustGrant(t, b, r2).Fence

	flush()
	r1.TTL = time.Minute
	if err := b.Refresh(ctx, r1); err != nil {
		t.Fatalf("Refresh after SCRIPT FLUSH: %v", err)
	}
	usedEval("Refresh")
	if pttl := rdb.PTTL(ctx, b.LockName(r1.Key)).Val(); pttl < 30*time.Second {
		t.Fatalf("PTTL after Refresh(1m): got %v", pttl)
	}

	flush()
	r2.TTL = time.Minute
	lost := dlock.Request{Key: key(t), Token: "nobody", TTL: time.Minute}
	errs := b.RefreshMany(ctx, []dlock.Request{r1, r2, lost})
	usedEval("RefreshMany")
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], dlock.ErrNotHeld) {
		t.Fatalf("RefreshMany after SCRIPT FLUSH: got %v, want [nil nil ErrNotHeld]", errs)
	}
	if pttl := rdb.PTTL(ctx, b.LockName(r2.Key)).Val(); pttl < 30*time.Second {
		t.Fatalf("PTTL after RefreshMany(1m): got %v", pttl)
	}

	flush()
	if err := b.Release(ctx, r1); err != nil {
		t.Fatalf("Release after SCRIPT FLUSH: %v", err)
	}
	usedEval("Release")
	noLock(t, rdb, b, "after Release", r1.Key)
	// And through a Client with the watchdog (RefreshMany of two leases).
	flush()
	c := locktest.Closing(t, dlock.New(redislock.New(rdb, opts...), dlock.WithTTL(300*time.Millisecond)))
	l1 := mustAcquire(t, ctx, c, key(t))
	l2 := mustAcquire(t, ctx, c, key(t))
	// Renewal batches: the pipelines the hook sees, or on the Backend's
	// connection the refreshes the server ran (two per batch).
	batches := func() int {
		n, _ := hook.pipes()
		return n + cmdCalls(t, rdb, "evalsha")/2
	}
	_, evalPipes := hook.pipes()
	flush()
	waitFor(t, 5*time.Second, "a renewal batch through the NOSCRIPT fallback", func() bool {
		_, n := hook.pipes()
		return n > evalPipes || hook.take()+cmdCalls(t, rdb, "eval", "script|load") > evals
	})
	all := batches()
	waitFor(t, 5*time.Second, "two more renewal batches", func() bool {
		return batches() >= all+2
	})
	if l1.Err() != nil || l2.Err() != nil {
		t.Fatalf("leases renewed across SCRIPT FLUSH: got %v, %v, want nil", l1.Err(), l2.Err())
	}
	if err := errors.Join(l1.Release(ctx), l2.Release(ctx)); err != nil {
		t.Fatal(err)
	}
}

// TestWrongType puts foreign values under the names of the lock and of its
// fence counter: every call fails with ErrWrongType naming the key, and
// the values are left intact.
func TestWrongType(t *testing.T) {
	rdb, b, ctx := onSrv(t)

	t.Run("LockKey", func(t *testing.T) {
		r := req(key(t), time.Minute)
		lock := b.LockName(r.Key)
		rdb.RPush(ctx, lock, "a", "b", "c")
		_, err := b.TryAcquire(ctx, r)
		if !errors.Is(err, dlock.ErrWrongType) || !strings.Contains(err.Error(), lock) || !strings.Contains(err.Error(), "list") {
			t.Fatalf("TryAcquire over a list: got %v, want ErrWrongType naming %q and list", err, lock)
		}
		if err := b.Refresh(ctx, r); !errors.Is(err, dlock.ErrWrongType) || !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Refresh over a list: got %v, want ErrWrongType and ErrNotHeld", err)
		}
		if err := b.Release(ctx, r); !errors.Is(err, dlock.ErrWrongType) || !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Release over a list: got %v, want ErrWrongType and ErrNotHeld", err)
		}
		if errs := b.RefreshMany(ctx, []dlock.Request{r, r}); !errors.Is(errs[0], dlock.ErrWrongType) || !errors.Is(errs[1], dlock.ErrWrongType) {
			t.Fatalf("RefreshMany over a list: got %v, want ErrWrongType", errs)
		}
		// Through a Client.
		_, err = newClient(t, rdb).TryAcquire(ctx, r.Key)
		if !errors.Is(err, dlock.ErrWrongType) || !strings.HasPrefix(err.Error(), "dlock: ") {
			t.Fatalf("Client.TryAcquire over a list: got %v, want a dlock error matching ErrWrongType", err)
		}
		if got := rdb.LRange(ctx, lock, 0, -1).Val(); strings.Join(got, ",") != "a,b,c" {
			t.Fatalf("the list after the calls: got %v, want [a b c]", got)
		}
		if ttl := rdb.TTL(ctx, lock).Val(); ttl != -1 {
			t.Fatalf("the list's TTL: got %v, want none", ttl)
		}
	})
	t.Run("UserString", func(t *testing.T) {
		r := req(key(t), time.Minute)
		lock := b.LockName(r.Key)
		rdb.Set(ctx, lock, "user data", 0)
		_, err := b.TryAcquire(ctx, r)
		if !errors.Is(err, dlock.ErrWrongType) || !strings.Contains(err.Error(), lock) || !strings.Contains(err.Error(), "string") {
			t.Fatalf("TryAcquire over a user's string: got %v, want ErrWrongType naming %q and string", err, lock)
		}
		if err := b.Release(ctx, r); !errors.Is(err, dlock.ErrWrongType) || !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("Release over a user's string: got %v, want ErrWrongType and ErrNotHeld", err)
		}
		if got := rdb.Get(ctx, lock).Val(); got != "user data" {
			t.Fatalf("the string after the calls: got %q, want it intact", got)
		}
	})
	t.Run("QueueKey", func(t *testing.T) {
		r := req(key(t), time.Minute)
		lock := b.LockName(r.Key)
		rdb.Set(ctx, lock+":q", "user data", 0)
		c := newClient(t, rdb)
		// Taking a free lock does not read the queue (TryAcquire, or the
		// first step of a wait); waiting behind a held lock does.
		mustGrant(t, b, r)
		ctx2, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := c.Acquire(ctx2, r.Key, dlock.WithFIFO()); !errors.Is(err, dlock.ErrWrongType) || !strings.Contains(err.Error(), lock+":q") {
			t.Fatalf("FIFO Acquire of a held lock with a string as the queue: got %v, want ErrWrongType naming %q", err, lock+":q")
		}
		if err := b.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
		if got := rdb.Get(ctx, lock+":q").Val(); got != "user data" {
			t.Fatalf("the string after the calls: got %q, want it intact", got)
		}
	})
	t.Run("ForeignHash", func(t *testing.T) {
		r := req(key(t), time.Minute)
		lock := b.LockName(r.Key)
		rdb.HSet(ctx, lock, "name", "user data")
		if _, err := b.TryAcquire(ctx, r); !errors.Is(err, dlock.ErrWrongType) {
			t.Fatalf("TryAcquire over a user's hash: got %v, want ErrWrongType", err)
		}
		if got := rdb.HGetAll(ctx, lock).Val(); len(got) != 1 || got["name"] != "user data" {
			t.Fatalf("the hash after the call: got %v, want {name: user data}", got)
		}
	})
}

// freeAddr returns a loopback address nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestUnreachable checks that acquiring on a port nobody listens on fails
// within the caller's 1s deadline with an error naming the address.
func TestUnreachable(t *testing.T) {
	addr := freeAddr(t)
	check := func(t *testing.T, err error, took time.Duration) {
		t.Helper()
		if err == nil {
			t.Fatal("acquiring on an unreachable server succeeded")
		}
		if took > time.Second+100*time.Millisecond {
			t.Fatalf("returned after %v, want within the 1s deadline", took)
		}
		t.Logf("failed after %v: %v", took, err)
	}
	t.Run("Backend", func(t *testing.T) {
		// The Backend's connection is dialled once: it fails at once,
		// naming the address.
		b := newBackend(t, newRDB(t, addr))
		ctx := ctxT(t, time.Second)
		start := time.Now()
		_, err := b.TryAcquire(ctx, req(key(t), time.Second))
		check(t, err, time.Since(start))
		if !strings.Contains(err.Error(), addr) || !strings.HasPrefix(err.Error(), "redislock: ") {
			t.Fatalf("error %q does not start with \"redislock: \" and name the address %s", err, addr)
		}
	})
	t.Run("Client", func(t *testing.T) {
		// With dial retries that end before the deadline, the Client
		// returns the Backend's error, which names the address.
		rdb := newRDB(t, addr, func(o *redis.Options) { o.MaxRetries, o.DialerRetries = -1, 1 })
		c := newClient(t, rdb)
		start := time.Now()
		_, err := c.Acquire(ctxT(t, time.Second), key(t))
		check(t, err, time.Since(start))
		if !strings.Contains(err.Error(), addr) || !strings.HasPrefix(err.Error(), "dlock: ") {
			t.Fatalf("error %q does not start with \"dlock: \" and name the address %s", err, addr)
		}
	})
	t.Run("ClientDeadline", func(t *testing.T) {
		// Through the pool, go-redis' default retries outlast the
		// deadline: the Client reports the context's error (not the
		// address; see the report on AcquireError).
		c := dlockClient(t, newRDB(t, addr), redislock.WithClientPool())
		start := time.Now()
		_, err := c.Acquire(ctxT(t, time.Second), key(t))
		check(t, err, time.Since(start))
		if !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
	})
}

// TestPausedServerHonoursContext checks that a server that stopped
// answering does not hold a call past the caller's deadline, on the own
// connection and on the go-redis pool, with and without go-redis'
// ContextTimeoutEnabled. A grant that arrives after the caller gave up is
// released at once (the own connection hands it back, the pool path's
// helper goroutine too), except on the pool with ContextTimeoutEnabled
// (go-redis ends the call at the deadline): then it expires with its TTL.
func TestPausedServerHonoursContext(t *testing.T) {
	for _, tc := range []struct {
		pool, ctxTimeouts bool
	}{{false, false}, {false, true}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("pool=%v/ContextTimeoutEnabled=%v", tc.pool, tc.ctxTimeouts), func(t *testing.T) {
			const readTimeout = 10 * time.Second
			rdb := newRDB(t, srv2.Addr(), func(o *redis.Options) {
				o.ContextTimeoutEnabled = tc.ctxTimeouts
				o.ReadTimeout = readTimeout
			})
			var opts []redislock.Option
			if tc.pool {
				opts = append(opts, redislock.WithClientPool())
			}
			b := newBackend(t, rdb, opts...)
			// Connected: the abandoned call below is on the wire before
			// the server stops, ahead of the later ones.
			mustRelease(t, b, holding(t, b, req(key(t), time.Minute)))
			if err := rdb.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			k := key(t)
			ttl := time.Minute
			expires := tc.pool && tc.ctxTimeouts
			if expires {
				ttl = 500 * time.Millisecond
			}
			resume := pause(t, srv2)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := b.TryAcquire(ctx, req(k, ttl))
			if !errors.Is(err, context.DeadlineExceeded) && !isTimeoutErr(err) {
				t.Fatalf("TryAcquire on a paused server: got %v, want a deadline error", err)
			}
			if took := time.Since(start); took >= readTimeout/2 {
				t.Fatalf("TryAcquire on a paused server returned after %v, want at the 200ms deadline, long before the %v read timeout", took, readTimeout)
			}
			if !strings.Contains(err.Error(), srv2.Addr()) {
				t.Fatalf("error %q does not name the address %s", err, srv2.Addr())
			}
			resume()
			// The abandoned attempt runs once the server is back; it must
			// not leave the lock held: given back at once (well within the
			// minute's TTL), or expired with its short TTL. It may run
			// after a command sent after the resume, so the key's absence
			// means something only once it has run.
			settled(t, rdb)
			waitFor(t, 10*time.Second, "the abandoned acquisition to be undone", func() bool {
				return rdb.Exists(context.Background(), b.LockName(k)).Val() == 0
			})
			mustGrant(t, b, req(k, time.Minute))
		})
	}
}

// settled returns once every command that was in the server's socket
// buffers when it resumed has run. Redis runs the commands of every
// connection found readable in one pass of its event loop, and a
// connection accepted in one pass is read in the next; a PING sent after
// the reply to the one before it is read in a later pass than that one,
// so the third of three is read two passes after the first pass at least.
func settled(t *testing.T, rdb *redis.Client) {
	t.Helper()
	for range 3 {
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// pause pauses r (SIGSTOP) and returns the function that resumes it,
// which the end of the test calls if the test did not.
func pause(t *testing.T, r *testserver.Redis) (resume func()) {
	t.Helper()
	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := r.Resume(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestOptions checks option validation and how its errors surface.
func TestOptions(t *testing.T) {
	rdb := newRDB(t, srv.Addr())
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr()}})
	t.Cleanup(func() { ring.Close() })
	ctx := ctxT(t, 5*time.Second)
	bad := map[string]*redislock.Backend{
		"NilClient":      redislock.New(nil),
		"NilTypedClient": redislock.New((*redis.Client)(nil)),
		"NilOption":      redislock.New(rdb, nil),
		"BracePrefix":    redislock.New(rdb, redislock.WithPrefix("x{")),
		"ClosePrefix":    redislock.New(rdb, redislock.WithPrefix("}")),
		"LongPrefix":     redislock.New(rdb, redislock.WithPrefix(strings.Repeat("p", 257))),
		"ZeroSubTimeout": redislock.New(rdb, redislock.WithSubscribeTimeout(0)),
		"NegSubTimeout":  redislock.New(rdb, redislock.WithSubscribeTimeout(-time.Second)),
		"NegPipelines":   redislock.New(rdb, redislock.WithPipelines(-1)),
		"ManyPipelines":  redislock.New(rdb, redislock.WithPipelines(1025)),
	}
	for name, b := range bad {
		t.Run(name, func(t *testing.T) {
			if err := b.Err(); !errors.Is(err, dlock.ErrInvalidOption) || !strings.HasPrefix(err.Error(), "redislock: ") {
				t.Fatalf("Err: got %v, want a redislock error matching ErrInvalidOption", err)
			}
			if _, err := b.TryAcquire(ctx, req("k", time.Second)); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("TryAcquire: got %v, want ErrInvalidOption", err)
			}
			if err := b.Release(ctx, req("k", time.Second)); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("Release: got %v, want ErrInvalidOption", err)
			}
			if _, _, err := b.Watch(ctx, "k"); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("Subscribe: got %v, want ErrInvalidOption", err)
			}
			if err := dlock.New(b).Err(); err != nil {
				// dlock.New does not probe the backend; the first call fails.
				t.Fatalf("dlock.New: %v", err)
			}
			if _, err := dlock.New(b).TryAcquire(ctx, "k"); !errors.Is(err, dlock.ErrInvalidOption) {
				t.Fatalf("Client.TryAcquire: got %v, want ErrInvalidOption", err)
			}
			if err := b.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		})
	}
	t.Run("EmptyPrefix", func(t *testing.T) {
		b := newBackend(t, rdb, redislock.WithPrefix(""))
		k := key(t)
		if got := b.LockName(k); got != "{"+k+"}" {
			t.Fatalf("LockName: got %q, want %q", got, "{"+k+"}")
		}
		mustGrant(t, b, req(k, time.Second))
	})
}

// TestBadRequests calls the Backend directly with invalid requests.
func TestBadRequests(t *testing.T) {
	b := newBackend(t, newRDB(t, srv.Addr()))
	ctx := ctxT(t, 5*time.Second)
	cases := []struct {
		name string
		r    dlock.Request
		want error
	}{
		{"EmptyKey", dlock.Request{Token: "t", TTL: time.Second}, dlock.ErrInvalidKey},
		{"LongKey", dlock.Request{Key: strings.Repeat("k", dlock.MaxKeyLen+1), Token: "t", TTL: time.Second}, dlock.ErrInvalidKey},
		{"EmptyToken", dlock.Request{Key: "k", TTL: time.Second}, dlock.ErrInvalidOption},
		{"ZeroTTL", dlock.Request{Key: "k", Token: "t"}, dlock.ErrInvalidTTL},
		{"SubMillisecondTTL", dlock.Request{Key: "k", Token: "t", TTL: time.Microsecond}, dlock.ErrInvalidTTL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := b.TryAcquire(ctx, tc.r); !errors.Is(err, tc.want) {
				t.Fatalf("TryAcquire: got %v, want %v", err, tc.want)
			}
			if err := b.Refresh(ctx, tc.r); !errors.Is(err, tc.want) {
				t.Fatalf("Refresh: got %v, want %v", err, tc.want)
			}
			if errs := b.RefreshMany(ctx, []dlock.Request{tc.r}); !errors.Is(errs[0], tc.want) {
				t.Fatalf("RefreshMany: got %v, want %v", errs, tc.want)
			}
		})
	}
	//lint:ignore SA1012 testing nil context handling
	if _, err := b.TryAcquire(nil, req("k", time.Second)); !errors.Is(err, dlock.ErrInvalidOption) { //nolint:staticcheck
		t.Fatalf("TryAcquire(nil ctx): got %v, want ErrInvalidOption", err)
	}
	if errs := b.RefreshMany(ctx, nil); len(errs) != 0 {
		t.Fatalf("RefreshMany(nil): got %v, want empty", errs)
	}
	// A sub-millisecond remainder is rounded up, never down.
	r := req(key(t), 1500*time.Microsecond)
	mustGrant(t, b, r)
}

// TestInspectForceRelease checks the operator capabilities.
func TestInspectForceRelease(t *testing.T) {
	rdb, b, ctx := onSrv(t)
	r := req(key(t), time.Minute)
	r.Reentrant = true
	if info, err := b.Inspect(ctx, r.Key); err != nil || info.Held || info.Key != r.Key || info.Waiters != 0 {
		t.Fatalf("Inspect of a free lock: got %+v, %v, want not held, Waiters 0", info, err)
	}
	g := mustGrant(t, b, r)
	mustGrant(t, b, r)
	info, err := b.Inspect(ctx, r.Key)
	if err != nil || !info.Held || info.Owner != r.Token || info.Fence != g.Fence || info.Count != 2 || info.TTL <= 30*time.Second || info.TTL > time.Minute {
		t.Fatalf("Inspect: got %+v, %v, want held by %q, fence %d, count 2, TTL ≈ 1m", info, err, r.Token, g.Fence)
	}
	ch, stop, err := b.Watch(ctx, r.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	forced, err := b.ForceRelease(ctx, r.Key)
	if err != nil || forced.Owner != info.Owner || forced.Fence != info.Fence || !forced.Held {
		t.Fatalf("ForceRelease: got %+v, %v, want what Inspect saw: %+v", forced, err, info)
	}
	notified(t, ch, "ForceRelease: the waiters")
	if err := b.Refresh(ctx, r); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh by the old holder after ForceRelease: got %v, want ErrNotHeld", err)
	}
	if info, err := b.ForceRelease(ctx, r.Key); err != nil || info.Held {
		t.Fatalf("ForceRelease of a free lock: got %+v, %v, want not held", info, err)
	}
	if g2 := mustGrant(t, b, req(r.Key, time.Second)); g2.Fence <= g.Fence {
		t.Fatalf("fence after ForceRelease: got %d, want > %d", g2.Fence, g.Fence)
	}
	list := key(t)
	rdb.RPush(ctx, b.LockName(list), "x")
	if _, err := b.ForceRelease(ctx, list); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("ForceRelease of a list: got %v, want ErrWrongType", err)
	}
	if _, err := b.Inspect(ctx, list); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("Inspect of a list: got %v, want ErrWrongType", err)
	}
	if n := rdb.LLen(ctx, b.LockName(list)).Val(); n != 1 {
		t.Fatalf("the list after ForceRelease: LLEN got %d, want 1", n)
	}
}

// TestCloseKeepsClient checks that Close leaves the user's go-redis client
// open and makes later calls fail with ErrClosed.
func TestCloseKeepsClient(t *testing.T) {
	rdb := newRDB(t, srv.Addr())
	b := redislock.New(rdb)
	ctx := ctxT(t, 5*time.Second)
	k := key(t)
	mustGrant(t, b, req(k, time.Second))
	ch, stop, err := b.Watch(ctx, k)
	if err != nil || ch == nil {
		t.Fatalf("Subscribe: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	stop() // after Close: harmless
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("the go-redis client after Backend.Close: %v", err)
	}
	if _, err := b.TryAcquire(ctx, req(k, time.Second)); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryAcquire after Close: got %v, want ErrClosed", err)
	}
	if _, _, err := b.Watch(ctx, k); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Subscribe after Close: got %v, want ErrClosed", err)
	}
}
