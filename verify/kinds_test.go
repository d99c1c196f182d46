package verify_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/verify"
)

// Each kind other than the lock, a short run on a throwaway redis-server
// under process pauses: the kind's exclusion holds on the server (no
// permit beyond N certainly live at once, in the histories and in the
// server's listing; no read hold overlapping a write hold; no two
// leaderships overlapping), the fences of the holds that write never go
// back, and the fenced register accepts no stale write and loses nothing.
func TestKindsPauseRedislock(t *testing.T) {
	for _, kind := range []string{"permits:2", "rw", "election"} {
		t.Run(strings.ReplaceAll(kind, ":", "-"), func(t *testing.T) {
			cfg := shortConfig(t, verify.FaultPause)
			cfg.Kind = kind
			cfg.Duration = 5 * time.Second
			cfg.Workers = 4
			rep, err := verify.Run(t.Context(), cfg, open)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			t.Logf("\n%s", rep.Table())
			f := rep.Runs[0].Findings
			if f.Hold == nil {
				t.Fatalf("got no hold findings for kind %q", kind)
			}
			if want := strings.TrimSuffix(kind, ":2"); !strings.HasPrefix(f.Hold.Kind, want) {
				t.Errorf("got hold kind %q, want %q", f.Hold.Kind, kind)
			}
			if f.Grants < 5 {
				t.Errorf("got %d grants, want at least 5", f.Grants)
			}
			if n := len(f.LeaseOverlaps); n != 0 {
				t.Errorf("got %d conflicting holds, want 0: %s", n, f.Hold.Example)
			}
			if n := len(f.FenceRegressions); n != 0 {
				t.Errorf("got %d fence regressions, want 0: %+v", n, f.FenceRegressions[0])
			}
			if f.Fenced == nil || f.Fenced.StaleAccepted != 0 || f.Fenced.LostUpdates != 0 {
				t.Errorf("fenced register: got %+v, want no stale write accepted and no update lost", f.Fenced)
			}
			if f.Fenced != nil && f.Fenced.WritesOK == 0 {
				t.Error("fenced register: no write was acknowledged")
			}
			switch kind {
			case "permits:2":
				if f.Hold.Permits != 2 || f.Hold.MaxLive > 2 {
					t.Errorf("got permits %d, most live at once %d, want 2 and at most 2", f.Hold.Permits, f.Hold.MaxLive)
				}
				if f.Hold.ServerChecks == 0 || f.Hold.ServerExcess != 0 || f.Hold.ServerMax > 2 {
					t.Errorf("server's view: got %d reads, %d over the permits, at most %d holds; want reads, none over, at most 2",
						f.Hold.ServerChecks, f.Hold.ServerExcess, f.Hold.ServerMax)
				}
			case "rw":
				if f.Hold.Reads == 0 || f.Hold.Writes == 0 {
					t.Errorf("got %d read holds and %d write holds, want both", f.Hold.Reads, f.Hold.Writes)
				}
			}
			if !strings.Contains(rep.Table(), "["+kind+"]") {
				t.Errorf("the table does not label the row [%s]:\n%s", kind, rep.Table())
			}
		})
	}
}

// A kind the harness does not know, or a semaphore without permits, is an
// invalid configuration.
func TestKindInvalid(t *testing.T) {
	for _, kind := range []string{"mutex", "permits:0", "permits:x", "permits"} {
		cfg := shortConfig(t, verify.FaultNone)
		cfg.Kind = kind
		if _, err := verify.Run(t.Context(), cfg, open); !errors.Is(err, verify.ErrInvalidConfig) {
			t.Errorf("kind %q: got %v, want ErrInvalidConfig", kind, err)
		}
	}
}

// hold is grant for an acquisition of a kind other than the lock.
func hold(kind, proc, owner string, fence uint64, inv, comp, expires, permits int64) verify.Event {
	e := grant(proc, owner, fence, inv, comp, expires)
	e.Hold, e.Value = kind, permits
	return e
}

// The checker finds each kind's conflicts in synthetic histories and
// accepts the holds the kind allows at once.
func TestCheckKinds(t *testing.T) {
	t.Run("permits", func(t *testing.T) {
		f := check(t, []verify.Event{
			hold(verify.HoldPermit, "w1.1", "a", 1, 0, 10, 500, 2),
			hold(verify.HoldPermit, "w2.1", "b", 2, 0, 20, 500, 2), // 2 live: allowed
			hold(verify.HoldPermit, "w3.1", "c", 3, 0, 30, 500, 2), // 3 live: one too many
			{Proc: "w3.1", Op: verify.OpInspect, Key: "k", InvokeNs: 31 * ms, CompleteNs: 32 * ms, Outcome: verify.OutcomeOK, Count: 3, Value: 2},
		})
		if f.Hold == nil || f.Hold.Kind != "permits:2" || f.Hold.MaxLive != 3 {
			t.Fatalf("got %+v, want kind permits:2 with 3 live at once", f.Hold)
		}
		if len(f.LeaseOverlaps) != 1 || f.LeaseOverlaps[0].B.Owner != "c" {
			t.Errorf("got overlaps %+v, want the grant to c", f.LeaseOverlaps)
		}
		if f.Hold.ServerExcess != 1 || len(f.Violations()) != 2 {
			t.Errorf("got server excess %d, violations %q, want 1 and 2 lines", f.Hold.ServerExcess, f.Violations())
		}
	})
	t.Run("rw", func(t *testing.T) {
		f := check(t, []verify.Event{
			hold(verify.HoldRead, "w1.1", "a", 1, 0, 10, 500, 0),
			hold(verify.HoldRead, "w2.1", "b", 2, 0, 20, 500, 0),   // readers share: allowed
			hold(verify.HoldWrite, "w3.1", "c", 2, 25, 30, 500, 0), // over both readers, fence not above b's
		})
		if f.Hold == nil || f.Hold.Kind != "rw" || f.Hold.Reads != 2 || f.Hold.Writes != 1 {
			t.Fatalf("got %+v, want kind rw with 2 reads and 1 write", f.Hold)
		}
		if len(f.LeaseOverlaps) != 2 {
			t.Errorf("got %d overlaps, want 2 (the writer over each reader)", len(f.LeaseOverlaps))
		}
		if len(f.FenceRegressions) != 1 || f.FenceRegressions[0].Later.Owner != "c" {
			t.Errorf("got regressions %+v, want the writer's", f.FenceRegressions)
		}
	})
	t.Run("election", func(t *testing.T) {
		f := check(t, []verify.Event{
			hold(verify.HoldLeader, "w1.1", "a", 1, 0, 10, 100, 0),
			release("w1.1", "a", 1, 50, 51),
			hold(verify.HoldLeader, "w2.1", "b", 2, 52, 60, 200, 0), // after the resignation: allowed
			hold(verify.HoldLeader, "w3.1", "c", 3, 70, 80, 300, 0), // while b leads
		})
		if f.Hold == nil || f.Hold.Kind != "election" {
			t.Fatalf("got %+v, want kind election", f.Hold)
		}
		if len(f.LeaseOverlaps) != 1 || f.LeaseOverlaps[0].A.Owner != "b" || f.LeaseOverlaps[0].B.Owner != "c" {
			t.Errorf("got overlaps %+v, want c granted while b leads", f.LeaseOverlaps)
		}
		if f.Verdict() != "FAIL" {
			t.Errorf("got verdict %s, want FAIL", f.Verdict())
		}
	})
}

// A pause of a holder of a kind counts only when the grants during the
// stop show that the server let its hold go: for permits:2, two other
// permits at once, not one (the other permit was free); for a read hold, a
// write hold, not another read hold.
func TestKindPauseTaken(t *testing.T) {
	pause := func(owner string, start, end int64) verify.Event {
		return verify.Event{Proc: "nemesis", Op: verify.FaultPause, Target: "w1.1", Owner: owner, InvokeNs: start * ms, CompleteNs: end * ms, Outcome: verify.OutcomeOK}
	}
	effective := func(f *verify.Findings) bool {
		for _, w := range f.Faults {
			if w.Kind == verify.FaultPause {
				return w.Effective
			}
		}
		return false
	}
	t.Run("permits-one-other", func(t *testing.T) {
		f := check(t, []verify.Event{
			hold(verify.HoldPermit, "w1.1", "a", 1, 0, 10, 200, 2),
			pause("a", 20, 400),
			hold(verify.HoldPermit, "w2.1", "b", 2, 30, 40, 300, 2), // the free permit
		}, verify.FaultPause)
		if effective(f) {
			t.Errorf("pause counted as effective with one other permit granted: %+v", f.Faults)
		}
	})
	t.Run("permits-two-others", func(t *testing.T) {
		f := check(t, []verify.Event{
			hold(verify.HoldPermit, "w1.1", "a", 1, 0, 10, 200, 2),
			pause("a", 20, 400),
			hold(verify.HoldPermit, "w2.1", "b", 2, 30, 40, 390, 2),
			hold(verify.HoldPermit, "w3.1", "c", 3, 250, 260, 390, 2), // a's permit went to c
		}, verify.FaultPause)
		if !effective(f) || len(f.Liveness) != 1 || f.Liveness[0] != 240*time.Millisecond {
			t.Errorf("got faults %+v, liveness %v; want effective, 240ms", f.Faults, f.Liveness)
		}
	})
	t.Run("reader", func(t *testing.T) {
		f := check(t, []verify.Event{
			hold(verify.HoldRead, "w1.1", "a", 1, 0, 10, 200, 0),
			pause("a", 20, 400),
			hold(verify.HoldRead, "w2.1", "b", 2, 30, 40, 300, 0), // readers share
		}, verify.FaultPause)
		if effective(f) {
			t.Errorf("pause of a reader counted as effective with a read hold granted: %+v", f.Faults)
		}
		f = check(t, []verify.Event{
			hold(verify.HoldRead, "w1.1", "a", 1, 0, 10, 200, 0),
			pause("a", 20, 400),
			hold(verify.HoldWrite, "w2.1", "b", 2, 250, 260, 390, 0),
		}, verify.FaultPause)
		if !effective(f) {
			t.Errorf("pause of a reader not effective although a writer took the key: %+v", f.Faults)
		}
	})
}
