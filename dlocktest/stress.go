package dlocktest

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// StressEnv names the environment variable that sets how long the Stress
// case runs (a time.Duration, default 3s). The long mode runs it for
// minutes:
//
//	DLOCK_STRESS=10m go test -run 'Conformance/Stress' -timeout 30m ./...
const StressEnv = "DLOCK_STRESS"

// stress runs random Clients and goroutines over a few keys with every
// option and lease operation mixed (owners shared within and across
// Clients, re-entries, per-call TTLs, Refresh, FIFO, AcquireMany, contexts
// ending at random points, Close at random moments) and checks while it
// runs that no two owners' leases are valid at once by their Expires,
// that fences never go back, that a live lease is held on the server with
// a deadline covering its Expires (Inspector), and at the end that
// nothing is left held.
func (s *suite) stress(t *testing.T) {
	d := locktest.EnvDuration(t, StressEnv, 3*time.Second)
	const workers, nkeys, nclients = 10, 3, 3
	st := &stressState{s: s, t: t, held: make(map[string][]*stressHold), maxFence: make(map[string]uint64)}
	base := Key(t)
	for i := 0; i < nkeys; i++ {
		st.keys = append(st.keys, fmt.Sprintf("%s.%d", base, i))
	}
	st.owners = []string{owner(), owner(), owner()}
	for i := 0; i < nclients; i++ {
		st.clients = append(st.clients, st.newClient())
	}
	ib := s.h.NewBackend(t)
	defer ib.Close()
	st.insp, _ = ib.(dlock.Inspector)
	if ks, ok := ib.(dlock.KindSupporter); ok {
		st.reads = ks.SupportsKind(dlock.KindRead)
		if ks.SupportsKind(dlock.KindPermit) {
			st.semKey = base + ".sem"
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil && !t.Failed() {
				st.step(ctx, rng)
			}
		}()
	}
	wg.Add(2)
	go func() { defer wg.Done(); st.closer(ctx) }()
	go func() { defer wg.Done(); st.inspector(ctx) }()
	wg.Wait()

	st.mu.Lock()
	clients := st.clients
	st.mu.Unlock()
	for _, c := range clients {
		st.closeClient(c)
	}
	// Nothing left: every key free within the longest TTL used (a
	// re-entry whose answer was lost may leave its hold for that long).
	// A long TTL: a slow grant on a loaded machine is not taken for a
	// lock still held.
	fresh := s.client(t, dlock.WithTTL(20*s.h.TTL))
	for _, k := range append(st.keys, st.semKey) {
		if k == "" {
			continue
		}
		// Free within the window (4 TTL + slack). A server that does not
		// answer in time (a loaded machine) is asked again, up to a minute
		// past the window; only a key the server still reports held when
		// the window ends fails the test.
		window := time.Now().Add(4*s.h.TTL + s.h.Slack)
		giveUp := window.Add(time.Minute)
		for {
			actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			l, err := fresh.TryAcquire(actx, k)
			cancel()
			if err == nil {
				l.Release(context.Background())
				break
			}
			held := errors.Is(err, dlock.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
			if held && time.Now().After(window) {
				t.Fatalf("key %s still held after every Client closed: %v", k, err)
			}
			if time.Now().After(giveUp) {
				t.Fatalf("key %s: no answer from the server a minute after the window: %v", k, err)
			}
			time.Sleep(s.h.TTL / 10)
		}
	}
	t.Logf("stress %v: %d grants (%d re-entries, %d AcquireMany, %d FIFO, %d read holds, %d permits), %d refreshes, %d releases, %d cancelled or timed-out waits, %d closes, %d inspections, %d lost, %d server errors",
		d, st.n.grants.Load(), st.n.reentries.Load(), st.n.many.Load(), st.n.fifo.Load(), st.n.reads.Load(), st.n.permits.Load(), st.n.refreshes.Load(), st.n.releases.Load(), st.n.cancelled.Load(), st.n.closes.Load(), st.n.inspections.Load(), st.n.lost.Load(), st.n.serverErrs.Load())
}

type stressHold struct {
	l       *dlock.Lease
	c       *dlock.Client
	how     string      // the call that took it, for reports
	start   time.Time   // when that call began
	leaving atomic.Bool // Release was called or is about to be
}

func (h *stressHold) String() string {
	return fmt.Sprintf("%s %s fence %d by %s (called %v ago, Expires in %v, Err %v)",
		h.l.Kind(), h.l.Owner(), h.l.Fence(), h.how, time.Since(h.start).Round(time.Millisecond), time.Until(h.l.Expires()).Round(time.Millisecond), h.l.Err())
}

// valid reports whether the hold claims the lock at time now.
func (h *stressHold) valid(now time.Time) bool {
	return !h.leaving.Load() && h.l.Err() == nil && now.Before(h.l.Expires())
}

type stressState struct {
	s       *suite
	t       *testing.T
	keys    []string
	owners  []string
	insp    dlock.Inspector
	reads   bool   // the backend has read holds
	semKey  string // a semaphore's key, when the backend has permits
	mu      sync.Mutex
	clients []*dlock.Client
	closing map[*dlock.Client]bool
	held    map[string][]*stressHold
	// maxFence is the highest fence granted per key.
	maxFence map[string]uint64
	n        struct {
		grants, reentries, many, fifo, reads, permits, refreshes, releases, cancelled, closes, inspections, lost, serverErrs atomic.Int64
	}
}

func (st *stressState) newClient() *dlock.Client {
	return dlock.New(st.s.h.NewBackend(st.t), dlock.WithTTL(st.s.h.TTL))
}

// closer closes a random Client now and then and replaces it.
func (st *stressState) closer(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(200+mrand.N(800)) * time.Millisecond):
		}
		if st.t.Failed() {
			return
		}
		st.mu.Lock()
		i := mrand.N(len(st.clients))
		c := st.clients[i]
		st.clients[i] = st.newClient()
		st.mu.Unlock()
		st.closeClient(c)
		st.n.closes.Add(1)
	}
}

func (st *stressState) closeClient(c *dlock.Client) {
	st.mu.Lock()
	if st.closing == nil {
		st.closing = make(map[*dlock.Client]bool)
	}
	st.closing[c] = true
	st.mu.Unlock()
	if err := c.Close(); err != nil {
		// A release the server did not answer in time (a loaded machine):
		// the lock then expires by itself, which the final check covers.
		if n := st.n.serverErrs.Add(1); n <= 5 {
			st.t.Logf("Close: server error: %v", err)
		}
	}
}

// inspector checks live leases against the server's view.
func (st *stressState) inspector(ctx context.Context) {
	if st.insp == nil {
		return
	}
	for ctx.Err() == nil && !st.t.Failed() {
		time.Sleep(time.Duration(5+mrand.N(20)) * time.Millisecond)
		st.mu.Lock()
		var h *stressHold
		if hs := st.held[st.keys[mrand.N(len(st.keys))]]; len(hs) > 0 {
			h = hs[mrand.N(len(hs))]
		}
		closing := h != nil && st.closing[h.c]
		st.mu.Unlock()
		if h == nil || closing {
			continue
		}
		before := time.Now()
		exp := h.l.Expires()
		if !h.valid(before) || exp.Sub(before) < 5*time.Millisecond {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, st.s.h.TTL)
		info, err := st.insp.Inspect(ictx, h.l.Key())
		cancel()
		after := time.Now()
		st.mu.Lock()
		closing = st.closing[h.c]
		st.mu.Unlock()
		if err != nil || !h.valid(after) || closing {
			continue // the lease ended meanwhile, or the server did not answer
		}
		st.n.inspections.Add(1)
		if h.l.Kind() != dlock.KindLock {
			st.checkShared(h, info, before, after, exp)
			continue
		}
		switch {
		case !info.Held:
			st.t.Errorf("live lease %s (owner %s, fence %d, Expires in %v) is not held on the server", h.l.Key(), h.l.Owner(), h.l.Fence(), exp.Sub(before))
		case info.Fence != h.l.Fence():
			st.t.Errorf("live lease %s fence %d: the server holds fence %d (owner %s)", h.l.Key(), h.l.Fence(), info.Fence, info.Owner)
		case info.TTL > 0 && info.TTL+after.Sub(before)+2*time.Millisecond < exp.Sub(before):
			st.t.Errorf("live lease %s: server TTL %v does not cover Expires in %v", h.l.Key(), info.TTL, exp.Sub(before))
		}
	}
}

// checkShared checks a permit or read hold against the server's view.
func (st *stressState) checkShared(h *stressHold, info dlock.Info, before, after, exp time.Time) {
	for _, o := range info.Holds {
		if o.Owner != h.l.Owner() {
			continue
		}
		if o.Fence != h.l.Fence() {
			st.t.Errorf("live %s hold %s fence %d: the server holds fence %d", h.l.Kind(), h.l.Key(), h.l.Fence(), o.Fence)
		} else if o.TTL > 0 && o.TTL+after.Sub(before)+2*time.Millisecond < exp.Sub(before) {
			st.t.Errorf("live %s hold %s: server TTL %v does not cover Expires in %v", h.l.Kind(), h.l.Key(), o.TTL, exp.Sub(before))
		}
		return
	}
	st.t.Errorf("live %s hold %s (owner %s, fence %d, Expires in %v) is not held on the server", h.l.Kind(), h.l.Key(), h.l.Owner(), h.l.Fence(), exp.Sub(before))
}

// conflicts reports whether holds a and b of different owners may not be
// valid at once: a lock excludes every other hold of its key, read holds
// exclude only locks, permits are counted instead.
func conflicts(a, b dlock.Kind) bool {
	return a == dlock.KindLock || b == dlock.KindLock
}

// register records a grant and checks it against every valid hold of
// another owner and against the key's fences.
func (st *stressState) register(c *dlock.Client, l *dlock.Lease, how string, start time.Time) *stressHold {
	h := &stressHold{l: l, c: c, how: how, start: start}
	now := time.Now()
	st.mu.Lock()
	defer st.mu.Unlock()
	k := l.Key()
	if errors.Is(l.Err(), dlock.ErrReleased) {
		// Released before it could be checked (its Client closed between
		// the grant's return and now): a lease ends before its lock is
		// given back, so whoever was granted the lock since then was
		// granted it after this lease ended.
		st.held[k] = append(st.held[k], h)
		st.n.grants.Add(1)
		return h
	}
	permits := 1
	for _, o := range st.held[k] {
		if o.l.Owner() == l.Owner() || !o.valid(now) {
			continue
		}
		if o.l.Kind() == dlock.KindPermit && l.Kind() == dlock.KindPermit {
			permits++
			continue
		}
		if conflicts(o.l.Kind(), l.Kind()) {
			st.t.Errorf("two owners inside %s: %v, and %v granted now", k, o, h)
		}
	}
	if permits > stressPermits {
		st.t.Errorf("%d permits valid at once on %s, the semaphore has %d", permits, k, stressPermits)
	}
	if m := st.maxFence[k]; l.Fence() < m && now.Before(l.Expires()) && l.Kind() == dlock.KindLock {
		st.t.Errorf("fence went back on %s: %v granted after fence %d", k, h, m)
	}
	st.maxFence[k] = max(st.maxFence[k], l.Fence())
	st.held[k] = append(st.held[k], h)
	st.n.grants.Add(1)
	return h
}

func (st *stressState) unregister(h *stressHold) {
	h.leaving.Store(true)
	st.mu.Lock()
	defer st.mu.Unlock()
	k := h.l.Key()
	hs := st.held[k]
	for i, o := range hs {
		if o == h {
			st.held[k] = append(hs[:i], hs[i+1:]...)
			break
		}
	}
}

// release ends a hold: unregistered first, so the checker never sees a
// lock released on the server while the hold still claims it.
func (st *stressState) release(h *stressHold) {
	st.unregister(h)
	err := h.l.Release(context.Background())
	st.n.releases.Add(1)
	switch {
	case err == nil, errors.Is(err, dlock.ErrLost), errors.Is(err, dlock.ErrReleased), errors.Is(err, dlock.ErrNotHeld):
	case errors.Is(err, dlock.ErrClosed), strings.Contains(err.Error(), "closed"):
	case errors.Is(err, dlock.ErrInvalidOption), errors.Is(err, dlock.ErrInvalidKey):
		st.t.Errorf("Release %s: %v", h.l.Key(), err)
	default:
		// A server that did not answer in time: the lease still ended and
		// its lock expires by itself (Release's contract).
		if n := st.n.serverErrs.Add(1); n <= 5 {
			st.t.Logf("Release %s: server error: %v", h.l.Key(), err)
		}
		if h.l.Err() == nil {
			st.t.Errorf("Release %s failed (%v) and the lease did not end", h.l.Key(), err)
		}
	}
	if errors.Is(h.l.Err(), dlock.ErrLost) {
		st.n.lost.Add(1)
	}
}

func (st *stressState) ttl(rng *mrand.Rand) time.Duration {
	return st.s.h.TTL * time.Duration(1+rng.IntN(3))
}

// opts returns random options for one acquisition.
func (st *stressState) opts(rng *mrand.Rand, id string) ([]dlock.Option, string) {
	ttl := st.ttl(rng)
	opts := []dlock.Option{dlock.WithTTL(ttl)}
	desc := "ttl " + ttl.String()
	if id != "" {
		opts = append(opts, dlock.WithOwner(id))
	}
	if rng.IntN(5) == 0 {
		opts = append(opts, dlock.WithAutoRenew(false))
		desc += ", no auto-renew"
	}
	return opts, desc
}

// waitCtx returns a context that ends at a random point: at once, within
// a few milliseconds, or after a TTL.
func (st *stressState) waitCtx(rng *mrand.Rand) (context.Context, context.CancelFunc) {
	switch rng.IntN(5) {
	case 0:
		return context.WithTimeout(context.Background(), time.Duration(rng.IntN(2000))*time.Microsecond)
	case 1:
		return context.WithTimeout(context.Background(), time.Duration(rng.IntN(50))*time.Millisecond)
	default:
		return context.WithTimeout(context.Background(), 2*st.s.h.TTL)
	}
}

// stressPermits is the stress semaphore's number of permits.
const stressPermits = 2

// step runs one random scenario: acquire (one key or many), work with
// re-entries and refreshes, release.
func (st *stressState) step(ctx context.Context, rng *mrand.Rand) {
	st.mu.Lock()
	c := st.clients[rng.IntN(len(st.clients))]
	st.mu.Unlock()
	sc := stepCall{c: c, start: time.Now()}
	if rng.IntN(2) == 0 {
		sc.id = st.owners[rng.IntN(len(st.owners))]
	}
	wctx, cancel := st.waitCtx(rng)
	defer cancel()
	sc.deadline, _ = wctx.Deadline()
	holds := st.acquireRandom(wctx, rng, sc)
	if len(holds) == 0 {
		return
	}
	holds = st.useHolds(ctx, rng, sc, holds)
	// Most holds are released in a random order; a few are left for Close.
	for _, i := range rng.Perm(len(holds)) {
		if rng.IntN(100) != 0 {
			st.release(holds[i])
		} else {
			st.unregisterLater(holds[i])
		}
	}
}

// stepCall is what one step's operations share: the Client, the owner id
// ("" for none), and the start and deadline of the step's wait.
type stepCall struct {
	c        *dlock.Client
	id       string
	start    time.Time
	deadline time.Time
}

// how describes an operation of the step for violation reports.
func (sc stepCall) how(op, desc string) string {
	return fmt.Sprintf("%s(owner %q, %s, ctx %v)", op, sc.id, desc, sc.deadline.Sub(sc.start).Round(time.Microsecond))
}

// acquireRandom takes one random kind of hold (a lock by Acquire,
// TryAcquire, FIFO or AcquireMany, a read hold or a permit) and returns
// the holds it registered; none when the attempt failed.
func (st *stressState) acquireRandom(wctx context.Context, rng *mrand.Rand, sc stepCall) []*stressHold {
	var holds []*stressHold
	c, start := sc.c, sc.start
	switch r := rng.IntN(12); {
	case r == 10 && st.reads:
		opts, desc := st.opts(rng, "")
		l, err := c.RWLock(st.keys[rng.IntN(len(st.keys))]).RLock(wctx, opts...)
		if st.acquired(err) {
			st.n.reads.Add(1)
			holds = append(holds, st.register(c, l, sc.how("RLock", desc), start))
		}
	case r == 11 && st.semKey != "":
		opts, desc := st.opts(rng, "")
		l, err := c.Semaphore(st.semKey, stressPermits).Acquire(wctx, opts...)
		if st.acquired(err) {
			st.n.permits.Add(1)
			holds = append(holds, st.register(c, l, sc.how("Semaphore.Acquire", desc), start))
		}
	case r >= 10:
	case r == 0:
		i, j := rng.IntN(len(st.keys)), rng.IntN(len(st.keys))
		if i == j {
			j = (i + 1) % len(st.keys)
		}
		opts, desc := st.opts(rng, sc.id)
		ls, err := c.AcquireMany(wctx, []string{st.keys[i], st.keys[j]}, opts...)
		if st.acquired(err) {
			st.n.many.Add(1)
			for _, l := range ls {
				holds = append(holds, st.register(c, l, sc.how("AcquireMany", desc), start))
			}
		}
	default:
		opts, desc := st.opts(rng, sc.id)
		if r == 1 && st.s.h.FIFO {
			opts = append(opts, dlock.WithFIFO())
			desc += ", FIFO"
			st.n.fifo.Add(1)
		}
		var l *dlock.Lease
		var err error
		op := "Acquire"
		if r == 2 {
			op = "TryAcquire"
			l, err = c.TryAcquire(wctx, st.keys[rng.IntN(len(st.keys))], opts...)
		} else {
			l, err = c.Acquire(wctx, st.keys[rng.IntN(len(st.keys))], opts...)
		}
		if st.acquired(err) {
			holds = append(holds, st.register(c, l, sc.how(op, desc), start))
		}
	}
	return holds
}

// useHolds works with the step's holds: up to three random re-entries (of
// a lock, by the step's owner id), refreshes to random TTLs, and short
// pauses. It returns the holds with the re-entries added.
func (st *stressState) useHolds(ctx context.Context, rng *mrand.Rand, sc stepCall, holds []*stressHold) []*stressHold {
	for n := rng.IntN(4); n > 0 && ctx.Err() == nil; n-- {
		h := holds[rng.IntN(len(holds))]
		switch rng.IntN(3) {
		case 0:
			if sc.id == "" || h.l.Kind() != dlock.KindLock {
				continue
			}
			rctx, cancel := st.waitCtx(rng)
			rstart := time.Now()
			opts, desc := st.opts(rng, sc.id)
			l, err := sc.c.TryAcquire(rctx, h.l.Key(), opts...)
			cancel()
			if st.acquired(err) {
				st.n.reentries.Add(1)
				holds = append(holds, st.register(sc.c, l, "re-entry "+sc.how("TryAcquire", desc), rstart))
			}
		case 1:
			rctx, cancel := st.waitCtx(rng)
			err := h.l.Refresh(rctx, st.ttl(rng))
			cancel()
			if err == nil {
				st.n.refreshes.Add(1)
			}
		case 2:
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		}
	}
	return holds
}

// unregisterLater leaves a hold to its Client's Close, keeping it checked
// until it ends.
func (st *stressState) unregisterLater(h *stressHold) {
	go func() {
		<-h.l.Done()
		st.unregister(h)
	}()
}

// acquired reports a successful acquisition; expected failures (the lock
// held elsewhere, a context ended, a closed Client, an owner whose hold
// was lost) are counted, others fail the test.
func (st *stressState) acquired(err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, dlock.ErrNotAcquired):
		st.n.cancelled.Add(1)
	case errors.Is(err, dlock.ErrClosed), errors.Is(err, dlock.ErrLost):
	default:
		// A server that did not answer in time on a loaded machine: not
		// what this test checks, but reported.
		if n := st.n.serverErrs.Add(1); n <= 5 {
			st.t.Logf("acquire: server error: %v", err)
		}
	}
	return false
}
