package dlocktest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// The cases below check semaphores and read-write locks on backends that
// implement them (dlock.KindSupporter).

func (s *suite) needKind(t *testing.T, k dlock.Kind) {
	t.Helper()
	b := s.h.NewBackend(t)
	defer b.Close()
	if ks, ok := b.(dlock.KindSupporter); !ok || !ks.SupportsKind(k) {
		t.Skipf("backend has no %s holds", k)
	}
}

// semaphoreLimit: at most N permits at once, from N Clients; a release
// lets a waiter in; fences increase.
func (s *suite) semaphoreLimit(t *testing.T) {
	s.needKind(t, dlock.KindPermit)
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	const n = 3
	var held []*dlock.Lease
	var last uint64
	for i := 0; i < n; i++ {
		l, err := s.client(t).Semaphore(key, n).TryAcquire(ctx)
		if err != nil {
			t.Fatalf("permit %d of %d: %v", i+1, n, err)
		}
		if l.Kind() != dlock.KindPermit || l.Fence() <= last {
			t.Fatalf("permit %d: kind %v fence %d, want permit and fence > %d", i+1, l.Kind(), l.Fence(), last)
		}
		last = l.Fence()
		held = append(held, l)
	}
	c := s.client(t)
	if _, err := c.Semaphore(key, n).TryAcquire(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("permit %d of %d: got %v, want ErrNotAcquired", n+1, n, err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := c.Semaphore(key, n).Acquire(ctx)
		if err == nil {
			if l.Fence() <= last {
				err = errors.New("fence of the permit after a release did not increase")
			}
			if rerr := l.Release(context.Background()); err == nil {
				err = rerr
			}
		}
		got <- err
	}()
	time.Sleep(s.h.TTL / 10)
	release(t, held[0])
	// The other permits are renewed throughout: only the release can let
	// the waiter in.
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter after a release: %v", err)
		}
	case <-time.After(s.long()):
		t.Fatal("waiter not served after a permit was released")
	}
	for _, l := range held[1:] {
		release(t, l)
	}
}

// semaphoreConcurrent: goroutines on several Clients never hold more than
// N permits at once.
func (s *suite) semaphoreConcurrent(t *testing.T) {
	s.needKind(t, dlock.KindPermit)
	key := Key(t)
	ctx := locktest.Ctx(t, 3*s.long())
	const n, workers, rounds = 2, 6, 8
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		sem := s.client(t).Semaphore(key, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				l, err := sem.Acquire(ctx)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				v := inside.Add(1)
				for m := most.Load(); v > m && !most.CompareAndSwap(m, v); m = most.Load() {
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				release(t, l)
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > n {
		t.Fatalf("permits held at once: got %d, want at most %d", m, n)
	}
}

// semaphoreBadInput: a permit count that disagrees with the holders', a
// count below 1, an owner, a key held as a lock: clear errors, nothing
// changed.
func (s *suite) semaphoreBadInput(t *testing.T) {
	s.needKind(t, dlock.KindPermit)
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	c := s.client(t)
	l := mustPermit(t, c, ctx, key, 3)
	defer release(t, l)
	if _, err := s.client(t).Semaphore(key, 2).TryAcquire(ctx); !errors.Is(err, dlock.ErrPermits) {
		t.Fatalf("2 permits where the holder says 3: got %v, want ErrPermits", err)
	}
	if l.Err() != nil {
		t.Fatalf("holder after a disagreeing request: %v", l.Err())
	}
	for _, n := range []int{0, -1} {
		if _, err := c.Semaphore(Key(t), n).TryAcquire(ctx); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("%d permits: got %v, want ErrInvalidOption", n, err)
		}
	}
	if _, err := c.Semaphore(Key(t), 2).TryAcquire(ctx, dlock.WithOwner("o")); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("WithOwner on a permit: got %v, want ErrInvalidOption", err)
	}
	lk := Key(t)
	h := locktest.MustAcquire(t, ctx, c, lk)
	defer release(t, h)
	if _, err := s.client(t).Semaphore(lk, 2).TryAcquire(ctx); !errors.Is(err, dlock.ErrWrongType) {
		t.Fatalf("a permit of a key held as a lock: got %v, want ErrWrongType", err)
	}
}

// semaphoreExpiry: a holder that dies gives its permit back within its
// TTL.
func (s *suite) semaphoreExpiry(t *testing.T) {
	s.needKind(t, dlock.KindPermit)
	s.skipExpiry(t)
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	dead := mustPermit(t, s.client(t), ctx, key, 1, dlock.WithAutoRenew(false))
	l, err := s.client(t).Semaphore(key, 1).Acquire(ctx)
	if err != nil {
		t.Fatalf("permit after the holder's TTL: %v", err)
	}
	defer release(t, l)
	if late := time.Since(dead.Expires()); late > s.h.Slack+dlock.Drift(s.h.TTL) {
		t.Fatalf("permit returned %v after the holder's Expires, want within %v", late, s.h.Slack)
	}
}

func mustPermit(t *testing.T, c *dlock.Client, ctx context.Context, key string, n int, opts ...dlock.Option) *dlock.Lease {
	t.Helper()
	l, err := c.Semaphore(key, n).Acquire(ctx, opts...)
	if err != nil {
		t.Fatalf("Semaphore(%q, %d).Acquire: %v", key, n, err)
	}
	return l
}

// rwShare: readers share; a writer excludes them and they exclude it;
// the writer's fence is above every reader's.
func (s *suite) rwShare(t *testing.T) {
	s.needKind(t, dlock.KindRead)
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	var readers []*dlock.Lease
	var top uint64
	for i := 0; i < 3; i++ {
		l, err := s.client(t).RWLock(key).TryRLock(ctx)
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		top = max(top, l.Fence())
		readers = append(readers, l)
	}
	w := s.client(t).RWLock(key)
	if _, err := w.TryLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryLock while readers hold: got %v, want ErrNotAcquired", err)
	}
	for _, l := range readers {
		release(t, l)
	}
	wl, err := w.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after the readers left: %v", err)
	}
	if wl.Fence() <= top {
		t.Fatalf("writer's fence %d, want above every reader's (%d)", wl.Fence(), top)
	}
	if _, err := s.client(t).RWLock(key).TryRLock(ctx); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryRLock while a writer holds: got %v, want ErrNotAcquired", err)
	}
	release(t, wl)
}

// rwWriterFirst: a waiting writer keeps new readers out; when it gives up
// they may enter at once. With the default wait and, on a backend that
// queues, with WithFIFO.
func (s *suite) rwWriterFirst(t *testing.T) {
	s.needKind(t, dlock.KindRead)
	t.Run("Default", func(t *testing.T) { s.rwWriterFirstWith(t) })
	t.Run("FIFO", func(t *testing.T) {
		b := s.h.NewBackend(t)
		_, waits := b.(dlock.Waiter)
		b.Close()
		if !waits {
			t.Skip("backend has no server-side queue")
		}
		s.rwWriterFirstWith(t, dlock.WithFIFO())
	})
	t.Run("Owner", func(t *testing.T) { s.rwWriterFirstWith(t, dlock.WithOwner("writer-"+Key(t))) })
}

// rwWriterFirstWith is rwWriterFirst with the writers' options opts.
func (s *suite) rwWriterFirstWith(t *testing.T, opts ...dlock.Option) {
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	r1, err := s.client(t).RWLock(key).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	wc := s.client(t)
	go func() {
		l, err := wc.RWLock(key).Lock(wctx, opts...)
		if err == nil {
			release(t, l)
		}
		got <- err
	}()
	probe := s.client(t).RWLock(key)
	locktest.WaitFor(t, s.long(),

		"a waiting writer keeps a new reader out", func() bool {
			l, err := probe.TryRLock(ctx)
			if err == nil {
				release(t, l)
			}
			return errors.Is(err, dlock.ErrNotAcquired)
		})

	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled writer: got %v, want context.Canceled", err)
	}
	r2, err := s.client(t).RWLock(key).TryRLock(ctx)
	if err != nil {
		t.Fatalf("reader after the writer gave up: %v", err)
	}
	release(t, r2)
	// A writer that waits gets the key when the readers leave.
	go func() {
		l, err := wc.RWLock(key).Lock(ctx, opts...)
		if err == nil {
			release(t, l)
		}
		got <- err
	}()
	time.Sleep(s.h.TTL / 10)
	release(t, r1)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("writer after the readers left: %v", err)
		}
	case <-time.After(s.h.TTL + s.h.Slack):
		t.Fatal("writer not served after the last reader left")
	}
}

// rwBadInput: a read hold released as a write, at the backend, changes
// nothing; WithOwner on a read hold is refused; a writer's withdrawal
// gives back no hold.
func (s *suite) rwBadInput(t *testing.T) {
	s.needKind(t, dlock.KindRead)
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	c := s.client(t)
	r, err := c.RWLock(key).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, r)
	b := s.h.NewBackend(t)
	defer b.Close()
	req := dlock.Request{Key: key, Token: r.Owner(), TTL: s.h.TTL, Fence: r.Fence()}
	if err := b.Release(ctx, req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("a read hold released as a write: got %v, want ErrNotHeld", err)
	}
	if w, err := s.client(t).RWLock(key).TryLock(ctx); err == nil {
		release(t, w)
		t.Fatal("the read hold is gone: a writer got the key")
	}
	if _, err := c.RWLock(key).RLock(ctx, dlock.WithOwner("o")); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("WithOwner on a read hold: got %v, want ErrInvalidOption", err)
	}
	// A writer's withdrawal (Waiting, Fence 0) never gives back a hold,
	// not even one its owner token has.
	wkey := key + "-w"
	w, err := c.RWLock(wkey).Lock(ctx, dlock.WithOwner("o"))
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, w)
	req = dlock.Request{Key: wkey, Token: w.Owner(), TTL: s.h.TTL, Waiting: true}
	if err := b.Release(ctx, req); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("a withdrawal by the holder's token: got %v, want ErrNotHeld", err)
	}
	if l, err := s.client(t).RWLock(wkey).TryRLock(ctx); err == nil {
		release(t, l)
		t.Fatal("a withdrawal gave back the write hold: a reader got the key")
	}
}
