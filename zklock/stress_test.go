package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/go-zookeeper/zk"
)

// TestStress runs random work against several Clients, each on its own
// session: waits and tries with contexts that end at random points,
// WithOwner ids shared between goroutines and Clients, re-entries,
// per-call TTLs, Refresh to other TTLs, auto-renew on and off, and Close
// of a Client at random moments. A checker verifies continuously that no
// two owners' leases are valid at once (Done open and Expires ahead),
// that fences increase per key, that a valid lease's node heads its queue
// on the server, and that nothing is left after the Clients close.
//
// It runs for 5s (2s with -short); ZKLOCK_STRESS=<duration> sets the
// time, e.g. ZKLOCK_STRESS=10m for the long mode.
func TestStress(t *testing.T) {
	dur := 5 * time.Second
	if testing.Short() {
		dur = 2 * time.Second
	}
	dur = locktest.EnvDuration(t, "ZKLOCK_STRESS", dur)
	s := newStress(t, 4, 3)
	s.run(dur, 12)
	t.Logf("ops: %v", s.ops.Snapshot())
	if n := s.violations.Load(); n > 0 {
		t.Fatalf("%d violations (first ones logged above)", n)
	}
}

const stressSession = 2 * time.Second

type stress struct {
	t      *testing.T
	keys   []string
	obs    *zk.Conn
	slots  []atomic.Pointer[dlock.Client]
	mu     sync.Mutex
	live   map[*dlock.Lease]*held
	fences map[string][]grantRec // per key: fences of fresh grants, in return order
	all    []*dlock.Client       // every Client made, for the final Close
	// closing are the Clients being closed: Close releases their leases
	// on the server before their Done closes, so they count as released.
	closing map[*dlock.Client]bool
	closers sync.WaitGroup // Closes in progress

	evmu   sync.Mutex
	events []string

	ops        locktest.Counts[string]
	violations atomic.Int64
	stop       atomic.Bool
}

type held struct {
	l         *dlock.Lease
	owner     string
	slot      int
	c         *dlock.Client
	at        time.Time
	releasing atomic.Bool // Release called: Done may stay open while the node is deleted
}

type grantRec struct {
	fence uint64
	owner string
	at    time.Time // when the grant returned
}

func newStress(t *testing.T, clients, keys int) *stress {
	s := &stress{
		t:       t,
		obs:     observer(t, zkServer.Addr()),
		slots:   make([]atomic.Pointer[dlock.Client], clients),
		live:    make(map[*dlock.Lease]*held),
		fences:  make(map[string][]grantRec),
		closing: make(map[*dlock.Client]bool),
	}
	k := locktest.Key(t)
	for i := range keys {
		s.keys = append(s.keys, fmt.Sprintf("%s.%d", k, i))
	}
	for i := range s.slots {
		s.slots[i].Store(s.newClient())
	}
	return s
}

func (s *stress) newClient() *dlock.Client {
	_, b := connect(s.t, zkServer.Addr(), stressSession)
	c := dlock.New(b, dlock.WithReleaseTimeout(time.Second))
	s.mu.Lock()
	s.all = append(s.all, c)
	s.mu.Unlock()
	return c
}

// logf records an event for the log printed with the first violation.
func (s *stress) logf(format string, args ...any) {
	s.evmu.Lock()
	s.events = append(s.events, time.Now().Format("05.000000")+" "+fmt.Sprintf(format, args...))
	if len(s.events) > 4000 {
		s.events = s.events[2000:]
	}
	s.evmu.Unlock()
}

func (s *stress) violation(format string, args ...any) {
	if s.violations.Add(1) == 1 {
		s.evmu.Lock()
		if os.Getenv("ZKLOCK_STRESS_LOG") != "" {
			os.WriteFile(os.Getenv("ZKLOCK_STRESS_LOG"), []byte(strings.Join(s.events, "\n")+"\n"+fmt.Sprintf(format, args...)+"\n"), 0o644)
		}
		s.evmu.Unlock()
	}
	if s.violations.Load() <= 10 {
		s.t.Errorf("VIOLATION at %s: "+format, append([]any{time.Now().Format("15:04:05.000000")}, args...)...)
	}
}

func (s *stress) run(dur time.Duration, workers int) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() { defer wg.Done(); s.monitor(done) }()
	var work sync.WaitGroup
	for w := range workers {
		work.Add(1)
		go func() { defer work.Done(); s.worker(w) }()
	}
	time.Sleep(dur) // the run's length: the workers go on meanwhile
	s.stop.Store(true)
	work.Wait()
	s.closers.Wait()
	close(done)
	wg.Wait()
	s.mu.Lock()
	all := slices.Clone(s.all)
	s.mu.Unlock()
	for _, c := range all {
		if err := c.Close(); err != nil && !errors.Is(err, dlock.ErrClosed) {
			s.t.Logf("Close: %v", err)
		}
	}
	// Nothing left: every session is closed, so every lock node is gone.
	for _, k := range s.keys {
		path := "/dlock/" + k
		children, _, err := s.obs.Children(path)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			s.t.Fatalf("Children(%s): %v", path, err)
		}
		if len(children) > 0 {
			s.violation("%s: %d nodes left after every Client closed: %v", k, len(children), children)
		}
	}
}

// worker runs random operations until the test stops.
func (s *stress) worker(w int) {
	rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	for !s.stop.Load() {
		slot := rng.IntN(len(s.slots))
		if rng.IntN(300) == 0 {
			s.ops.Add("close")
			old := s.slots[slot].Swap(s.newClient())
			s.logf("close slot %d", slot)
			// Close releases the leases on the server before their Done
			// closes: they count as being released from now on.
			s.mu.Lock()
			s.closing[old] = true
			for _, h := range s.live {
				if h.c == old {
					h.releasing.Store(true)
				}
			}
			s.mu.Unlock()
			s.closers.Add(1)
			go func() { defer s.closers.Done(); old.Close() }() // at a random moment for the other workers on it
			continue
		}
		s.session(rng, slot, s.slots[slot].Load(), 0)
	}
}

// session acquires a lock, maybe re-enters and refreshes it, and releases
// it; depth counts nested re-entries.
func (s *stress) session(rng *rand.Rand, slot int, c *dlock.Client, depth int) {
	k := s.keys[rng.IntN(len(s.keys))]
	var opts []dlock.Option
	owner := ""
	if rng.IntN(2) == 0 {
		owner = fmt.Sprintf("job-%d", rng.IntN(2))
		opts = append(opts, dlock.WithOwner(owner))
	}
	if rng.IntN(3) == 0 {
		opts = append(opts, dlock.WithTTL(100*time.Millisecond+time.Duration(rng.Int64N(int64(stressSession-100*time.Millisecond)))))
	}
	if rng.IntN(4) == 0 {
		opts = append(opts, dlock.WithAutoRenew(false))
	}
	ctx, cancel := s.ctx(rng)
	defer cancel()
	start := time.Now()
	var l *dlock.Lease
	var err error
	if rng.IntN(2) == 0 {
		s.ops.Add("try")
		l, err = c.TryAcquire(ctx, k, opts...)
	} else {
		s.ops.Add("acquire")
		l, err = c.Acquire(ctx, k, opts...)
	}
	if err != nil {
		s.ops.Add("acquire-fail")
		return
	}
	s.granted(l, c, owner, slot, start)
	s.ops.Add("granted")
	hold := time.Duration(rng.Int64N(int64(30 * time.Millisecond)))
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) && l.Err() == nil {
		switch rng.IntN(6) {
		case 0:
			ttl := 100*time.Millisecond + time.Duration(rng.Int64N(int64(stressSession)))
			rctx, rcancel := s.ctx(rng)
			err := l.Refresh(rctx, ttl)
			s.logf("refresh %s %s fence %d to %v: %v exp %v", l.Key(), l.Owner(), l.Fence(), ttl, err, l.Expires().Format("05.000"))
			if err == nil {
				s.ops.Add("refresh")
			} else {
				s.ops.Add("refresh-fail")
			}
			rcancel()
		case 1:
			if owner != "" && depth < 2 {
				s.ops.Add("reenter")
				s.reenter(rng, slot, c, k, owner, depth)
			}
		default:
			locktest.Work(l, time.Duration(rng.Int64N(int64(5*time.Millisecond))))
		}
	}
	s.release(l)
}

// reenter takes k again as owner, on the same Client or another.
func (s *stress) reenter(rng *rand.Rand, slot int, c *dlock.Client, k, owner string, depth int) {
	if rng.IntN(3) == 0 {
		slot = rng.IntN(len(s.slots))
		c = s.slots[slot].Load()
	}
	opts := []dlock.Option{dlock.WithOwner(owner)}
	if rng.IntN(2) == 0 {
		opts = append(opts, dlock.WithTTL(100*time.Millisecond+time.Duration(rng.Int64N(int64(stressSession-100*time.Millisecond)))))
	}
	ctx, cancel := s.ctx(rng)
	defer cancel()
	start := time.Now()
	l, err := c.TryAcquire(ctx, k, opts...)
	if err != nil {
		return
	}
	s.granted(l, c, owner, slot, start)
	s.ops.Add("reentered")
	locktest.Work(l, time.Duration(rng.Int64N(int64(5*time.Millisecond)))) // the nested hold's
	s.release(l)
	_ = depth
}

// ctx returns a context that ends at a random point, or after a second.
func (s *stress) ctx(rng *rand.Rand) (context.Context, context.CancelFunc) {
	if rng.IntN(3) == 0 {
		return context.WithTimeout(context.Background(), time.Duration(rng.Int64N(int64(5*time.Millisecond))))
	}
	return context.WithTimeout(context.Background(), time.Second)
}

func (s *stress) release(l *dlock.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.mu.Lock()
	if h := s.live[l]; h != nil {
		h.releasing.Store(true)
	}
	delete(s.live, l)
	s.mu.Unlock()
	err := l.Release(ctx)
	if errors.Is(err, dlock.ErrLost) || errors.Is(err, dlock.ErrNotHeld) {
		s.ops.Add("lost: " + lossKind(err))
		s.logf("LOST %s %s fence %d count %d: %v", l.Key(), l.Owner(), l.Fence(), l.Count(), err)
	}
	s.logf("release %s %s fence %d count %d: %v", l.Key(), l.Owner(), l.Fence(), l.Count(), err)
}

// valid reports whether l is valid now: Done open and Expires ahead.
func valid(l *dlock.Lease) bool {
	return l.Err() == nil && time.Now().Before(l.Expires())
}

// granted records l and checks it against every other lease of its key.
func (s *stress) granted(l *dlock.Lease, c *dlock.Client, owner string, slot int, start time.Time) {
	now := time.Now()
	if owner == "" {
		owner = l.Owner()
	}
	s.mu.Lock()
	var others []*held
	for _, h := range s.live {
		if h.l.Key() == l.Key() && h.owner != owner {
			others = append(others, h)
		}
	}
	recs := s.fences[l.Key()]
	for _, r := range recs {
		if r.at.Before(start) && (l.Fence() < r.fence || l.Fence() == r.fence && r.owner != owner) {
			s.violation("%s: fence %d granted to %s (call started %v) after fence %d of %s returned at %v",
				l.Key(), l.Fence(), owner, start.Format("15:04:05.000000"), r.fence, r.owner, r.at.Format("15:04:05.000000"))
			break
		}
	}
	s.fences[l.Key()] = append(recs, grantRec{l.Fence(), owner, now})
	if len(s.fences[l.Key()]) > 64 {
		s.fences[l.Key()] = s.fences[l.Key()][32:]
	}
	h := &held{l: l, owner: owner, slot: slot, c: c, at: now}
	h.releasing.Store(s.closing[c]) // Close releases it
	s.live[l] = h
	s.logf("grant %s %s slot %d fence %d count %d ttl %v exp %v", l.Key(), owner, slot, l.Fence(), l.Count(), l.TTL(), l.Expires().Format("05.000"))
	s.mu.Unlock()
	for _, h := range others {
		if valid(h.l) && !h.releasing.Load() && valid(l) {
			s.violation("%s: granted to %s (slot %d, fence %d, count %d, expires in %v) while %s (slot %d, fence %d, count %d) is valid for %v more",
				l.Key(), owner, slot, l.Fence(), l.Count(), time.Until(l.Expires()), h.owner, h.slot, h.l.Fence(), h.l.Count(), time.Until(h.l.Expires()))
		}
	}
}

// monitor checks, until done, that no two owners' leases of a key are
// valid at once, and that a valid lease's node heads its queue.
func (s *stress) monitor(done <-chan struct{}) {
	tick := time.NewTicker(3 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		s.mu.Lock()
		hs := make([]*held, 0, len(s.live))
		for _, h := range s.live {
			hs = append(hs, h)
		}
		s.mu.Unlock()
		// Valid in two passes: valid over the time between them.
		first := make(map[*held]bool)
		for _, h := range hs {
			first[h] = valid(h.l)
		}
		if n%10 == 0 {
			s.checkServer(hs, first)
		}
		byKey := make(map[string][]*held)
		for _, h := range hs {
			if first[h] && valid(h.l) && !h.releasing.Load() {
				byKey[h.l.Key()] = append(byKey[h.l.Key()], h)
			}
		}
		for k, vs := range byKey {
			for i := range vs {
				for j := i + 1; j < len(vs); j++ {
					if vs[i].owner != vs[j].owner {
						s.violation("%s: %s (slot %d, fence %d, expires in %v) and %s (slot %d, fence %d, expires in %v) both valid",
							k, vs[i].owner, vs[i].slot, vs[i].l.Fence(), time.Until(vs[i].l.Expires()),
							vs[j].owner, vs[j].slot, vs[j].l.Fence(), time.Until(vs[j].l.Expires()))
					}
				}
			}
		}
	}
}

// checkServer reads the head of the queue of every key with a lease
// valid before and after the read: its data must be the lease's owner.
func (s *stress) checkServer(hs []*held, first map[*held]bool) {
	for _, k := range s.keys {
		var before []*held
		for _, h := range hs {
			if h.l.Key() == k && first[h] {
				before = append(before, h)
			}
		}
		if len(before) == 0 {
			continue
		}
		path := "/dlock/" + k
		children, _, err := s.obs.Children(path)
		if err != nil {
			continue
		}
		head := ""
		if len(children) > 0 {
			slices.SortFunc(children, func(a, b string) int { return strings.Compare(seqOf(a), seqOf(b)) })
			data, _, err := s.obs.Get(path + "/" + children[0])
			if err != nil {
				continue // deleted meanwhile: look next time
			}
			head = string(data)
		}
		for _, h := range before {
			if valid(h.l) && !h.releasing.Load() && head != h.l.Owner() {
				s.violation("%s: lease of %s (slot %d, fence %d, count %d, expires in %v) valid, but the queue's head is %q (%v)",
					k, h.owner, h.slot, h.l.Fence(), h.l.Count(), time.Until(h.l.Expires()), head, children)
			}
		}
	}
}

func seqOf(name string) string { return name[max(0, len(name)-10):] }

// lossKind classifies the error of a lease's Release after a loss.
func lossKind(err error) string {
	msg := err.Error()
	for _, k := range []string{"expired", "is gone", "was deleted", "no longer", "closed", "not held"} {
		if strings.Contains(msg, k) {
			return k
		}
	}
	return msg
}
