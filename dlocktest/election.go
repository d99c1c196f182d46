package dlocktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

func (s *suite) needElection(t *testing.T) {
	t.Helper()
	b := s.h.NewBackend(t)
	defer b.Close()
	_, p := b.(dlock.Proclaimer)
	_, i := b.(dlock.Inspector)
	if !p || !i {
		t.Skip("backend has no leader election")
	}
}

// election: one leader at a time; losers see who leads; Proclaim and
// Observe; a resignation or a closed leader hands over with a higher term.
func (s *suite) election(t *testing.T) {
	s.needElection(t)
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	a, b := s.client(t).Election(key), s.client(t).Election(key)
	watcher := s.client(t).Election(key)
	if _, err := watcher.Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader before any campaign: got %v, want ErrNoLeader", err)
	}
	octx, stop := context.WithCancel(ctx)
	defer stop()
	seen := watcher.Observe(octx)
	if l := <-seen; l != (dlock.Leader{}) {
		t.Fatalf("first observation: got %+v, want no leader", l)
	}

	la, err := a.Campaign(ctx, "a")
	if err != nil {
		t.Fatalf("first campaign: %v", err)
	}
	won := make(chan *dlock.Lease, 1)
	go func() {
		lb, err := b.Campaign(ctx, "b")
		if err != nil {
			t.Errorf("second campaign: %v", err)
		}
		won <- lb
	}()
	cur, err := watcher.Leader(ctx)
	if err != nil || cur.Value != "a" || cur.Term != la.Fence() {
		t.Fatalf("Leader: got %+v, %v; want value a, term %d", cur, err, la.Fence())
	}
	awaitLeader(t, seen, "a", s.long())
	if err := b.Resign(ctx); !errors.Is(err, dlock.ErrNotLeader) {
		t.Fatalf("Resign by a campaigner that does not lead: got %v, want ErrNotLeader", err)
	}
	if err := b.Proclaim(ctx, "x"); !errors.Is(err, dlock.ErrNotLeader) {
		t.Fatalf("Proclaim by a campaigner that does not lead: got %v, want ErrNotLeader", err)
	}
	if err := a.Proclaim(ctx, "a2"); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	awaitLeader(t, seen, "a2", s.long())
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	var lb *dlock.Lease
	select {
	case lb = <-won:
	case <-time.After(s.long()):
		t.Fatal("second campaigner not elected after the leader resigned")
	}
	if lb == nil {
		t.FailNow()
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("second term %d, want above %d", lb.Fence(), la.Fence())
	}
	got := awaitLeader(t, seen, "b", s.long())
	if got.Term != lb.Fence() {
		t.Fatalf("observed term %d, want %d", got.Term, lb.Fence())
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
}

func awaitLeader(t *testing.T, ch <-chan dlock.Leader, value string, d time.Duration) dlock.Leader {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-ch:
			if !ok {
				t.Fatalf("Observe closed before leader %q", value)
			}
			if l.Value == value {
				return l
			}
		case <-deadline:
			t.Fatalf("leader %q not observed within %v", value, d)
		}
	}
}

// electionLost: a leader whose leadership is removed behind its back
// learns it through the lease, and can no longer proclaim.
func (s *suite) electionLost(t *testing.T) {
	s.needElection(t)
	fb := s.h.NewBackend(t)
	defer fb.Close()
	fr, ok := fb.(dlock.ForceReleaser)
	if !ok {
		t.Skip("backend has no ForceRelease")
	}
	key := Key(t)
	ctx := locktest.Ctx(t, s.long())
	e := s.client(t).Election(key)
	l, err := e.Campaign(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fr.ForceRelease(ctx, key); err != nil {
		t.Fatal(err)
	}
	err = e.Proclaim(ctx, "w")
	if !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrNotLeader) {
		t.Fatalf("Proclaim after the leadership was removed: got %v, want ErrNotHeld or ErrNotLeader", err)
	}
	select {
	case <-l.Done():
	case <-time.After(s.h.TTL + s.h.Slack):
		t.Fatal("removed leadership: Done not closed")
	}
	if !errors.Is(l.Err(), dlock.ErrLost) {
		t.Fatalf("removed leadership: Err %v, want ErrLost", l.Err())
	}
}
