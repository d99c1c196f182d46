package verify_test

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/verify"
)

const ms = int64(time.Millisecond)

const ttl = 400 * time.Millisecond

// Synthetic histories, times in milliseconds of the shared clock.

func spawn(proc string, worker int) verify.Event {
	return verify.Event{Proc: "coordinator", Op: verify.OpSpawn, Target: proc, Worker: worker, Outcome: verify.OutcomeOK}
}

func grant(proc, owner string, fence uint64, inv, comp, expires int64) verify.Event {
	return verify.Event{Proc: proc, Op: verify.OpAcquire, Key: "k", InvokeNs: inv * ms, CompleteNs: comp * ms,
		Outcome: verify.OutcomeOK, Fence: fence, Owner: owner, ExpiresNs: expires * ms}
}

func renew(proc, owner string, fence uint64, at, expires int64) verify.Event {
	return verify.Event{Proc: proc, Op: verify.OpRenew, Key: "k", InvokeNs: at * ms, CompleteNs: at * ms,
		Outcome: verify.OutcomeOK, Fence: fence, Owner: owner, ExpiresNs: expires * ms}
}

func release(proc, owner string, fence uint64, inv, comp int64) verify.Event {
	return verify.Event{Proc: proc, Op: verify.OpRelease, Key: "k", InvokeNs: inv * ms, CompleteNs: comp * ms,
		Outcome: verify.OutcomeOK, Fence: fence, Owner: owner}
}

var seq int64

func rw(proc, op, res, outcome, owner string, fence uint64, value, inv, comp int64) verify.Event {
	seq++
	return verify.Event{Proc: proc, Seq: seq, Op: op, Key: res, InvokeNs: inv * ms, CompleteNs: comp * ms,
		Outcome: outcome, Fence: fence, Owner: owner, Value: value}
}

func final(res string, value, increments int64) verify.Event {
	return verify.Event{Proc: "coordinator", Op: verify.OpFinal, Key: res, Outcome: verify.OutcomeOK, Value: value, Count: increments}
}

func check(t *testing.T, evs []verify.Event, faults ...string) *verify.Findings {
	t.Helper()
	f, err := verify.Check(verify.PairEvents(evs), verify.CheckOptions{TTL: ttl, Faults: faults})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return f
}

func TestCheckLeaseOverlap(t *testing.T) {
	// Every history begins with A's grant (fence 10, 0–10 ms, until 400 ms).
	tests := []struct {
		name  string
		after []verify.Event
		want  int
	}{
		{"grant while the lease was live", []verify.Event{grant("w2.0", "B", 11, 100, 200, 600)}, 1},
		{"grant after expiry", []verify.Event{grant("w2.0", "B", 11, 100, 450, 850)}, 0},
		{"grant after release", []verify.Event{
			release("w1.0", "A", 10, 150, 151),
			grant("w2.0", "B", 11, 100, 200, 600),
		}, 0},
		{"grant while a renewal kept the lease live", []verify.Event{
			renew("w1.0", "A", 10, 300, 700),
			grant("w2.0", "B", 11, 100, 500, 900),
		}, 1},
		{"grant racing a release", []verify.Event{
			// B completes after A's release was invoked: the release may
			// have been executed first.
			release("w1.0", "A", 10, 150, 170),
			grant("w2.0", "B", 11, 100, 160, 560),
		}, 0},
		{"same owner", []verify.Event{grant("w1.0", "A", 10, 20, 30, 430)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := check(t, append([]verify.Event{grant("w1.0", "A", 10, 0, 10, 400)}, tt.after...))
			if got := len(f.LeaseOverlaps); got != tt.want {
				t.Fatalf("got %d lease overlaps, want %d: %+v", got, tt.want, f.LeaseOverlaps)
			}
			if tt.want > 0 {
				if got := f.Verdict(); got != "FAIL" {
					t.Errorf("got verdict %s, want FAIL", got)
				}
				if v := f.Violations(); len(v) == 0 || !strings.Contains(v[0], "lease overlap") {
					t.Errorf("got violations %q, want a lease overlap", v)
				}
			}
		})
	}
}

func TestCheckFenceOrder(t *testing.T) {
	// A holds fence 10 and releases it; then B is granted fence.
	handoff := func(fence uint64) []verify.Event {
		return []verify.Event{
			grant("w1.0", "A", 10, 0, 10, 400), release("w1.0", "A", 10, 50, 51),
			grant("w2.0", "B", fence, 60, 70, 470),
		}
	}
	tests := []struct {
		name string
		evs  []verify.Event
		want int
	}{
		{"increasing", handoff(11), 0},
		{"smaller after", handoff(9), 1},
		{"equal from another owner", handoff(10), 1},
		{"equal from the same owner (reentrant)", []verify.Event{
			grant("w1.0", "A", 10, 0, 10, 400),
			grant("w1.0", "A", 10, 60, 70, 470),
		}, 0},
		{"concurrent grants are not ordered", []verify.Event{
			grant("w1.0", "A", 10, 0, 100, 400), release("w1.0", "A", 10, 150, 151),
			grant("w2.0", "B", 9, 50, 200, 600),
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := check(t, tt.evs)
			if got := len(f.FenceRegressions); got != tt.want {
				t.Fatalf("got %d fence regressions, want %d: %+v", got, tt.want, f.FenceRegressions)
			}
			if tt.want > 0 && f.Verdict() != "FAIL" {
				t.Errorf("got verdict %s, want FAIL", f.Verdict())
			}
		})
	}
}

// A paused holder A (fence 10) writes after B (fence 11) read and wrote.
func pausedHolder(res, lateWrite string) []verify.Event {
	evs := []verify.Event{
		grant("w1.0", "A", 10, 0, 10, 400),
		rw("w1.0", verify.OpRead, res, verify.OutcomeOK, "A", 10, 0, 20, 21),
		grant("w2.0", "B", 11, 30, 500, 900),
		rw("w2.0", verify.OpRead, res, verify.OutcomeOK, "B", 11, 0, 510, 511),
		rw("w2.0", verify.OpWrite, res, verify.OutcomeOK, "B", 11, 1, 560, 561),
		release("w2.0", "B", 11, 570, 571),
		rw("w1.0", verify.OpWrite, res, lateWrite, "A", 10, 1, 900, 901),
		release("w1.0", "A", 10, 910, 911),
	}
	switch {
	case lateWrite == verify.OutcomeOK:
		evs = append(evs, final(res, 1, 2))
	default:
		evs = append(evs, final(res, 1, 1))
	}
	return evs
}

func TestCheckResource(t *testing.T) {
	t.Run("naive register loses the update", func(t *testing.T) {
		f := check(t, pausedHolder(verify.ResourceNaive, verify.OutcomeOK))
		n := f.Naive
		if n == nil || n.LostUpdates != 1 || n.StaleAccepted != 1 || n.Linearizable != "Illegal" {
			t.Fatalf("got %+v, want 1 lost update, 1 stale write accepted, Illegal", n)
		}
		if f.BeliefOverlaps != 2 {
			t.Errorf("got %d belief overlaps, want 2", f.BeliefOverlaps)
		}
		// The naive register is the negative control: not a violation.
		if got := f.Verdict(); got != "PASS" {
			t.Errorf("got verdict %s (%q), want PASS", got, f.Violations())
		}
	})
	t.Run("fenced register rejects the stale write", func(t *testing.T) {
		f := check(t, pausedHolder(verify.ResourceFenced, verify.OutcomeStale))
		n := f.Fenced
		if n == nil || n.LostUpdates != 0 || n.StaleAccepted != 0 || n.WritesStale != 1 || n.Linearizable != "Ok" {
			t.Fatalf("got %+v, want no loss, 1 stale write rejected, Ok", n)
		}
		if got := f.Verdict(); got != "PASS" {
			t.Errorf("got verdict %s (%q), want PASS", got, f.Violations())
		}
	})
	t.Run("fenced register that accepts the stale write", func(t *testing.T) {
		f := check(t, pausedHolder(verify.ResourceFenced, verify.OutcomeOK))
		n := f.Fenced
		if n == nil || n.LostUpdates != 1 || n.StaleAccepted != 1 || n.Linearizable != "Illegal" {
			t.Fatalf("got %+v, want 1 lost update, 1 stale write accepted, Illegal", n)
		}
		if got := f.Verdict(); got != "FAIL" {
			t.Errorf("got verdict %s, want FAIL", got)
		}
	})
	t.Run("fenced register that accepts a claim it should refuse", func(t *testing.T) {
		evs := pausedHolder(verify.ResourceFenced, verify.OutcomeStale)
		// A second claim by A after B's: the register must refuse it.
		evs = append(evs, rw("w1.0", verify.OpRead, verify.ResourceFenced, verify.OutcomeOK, "A", 10, 1, 905, 906))
		f := check(t, evs)
		if got := f.Fenced.Linearizable; got != "Illegal" {
			t.Errorf("got %s, want Illegal", got)
		}
	})
	t.Run("unknown write of a killed process", func(t *testing.T) {
		evs := []verify.Event{
			spawn("w1.0", 1), spawn("w2.0", 2),
			grant("w1.0", "A", 10, 0, 10, 400),
			rw("w1.0", verify.OpRead, verify.ResourceNaive, verify.OutcomeOK, "A", 10, 0, 20, 21),
			rw("w1.0", verify.OpWrite, verify.ResourceNaive, verify.OutcomeInvoke, "A", 10, 1, 30, 0),
			{Proc: "coordinator", Op: verify.OpExit, Target: "w1.0", InvokeNs: 31 * ms, CompleteNs: 31 * ms, Outcome: verify.OutcomeOK},
			grant("w2.0", "B", 11, 40, 450, 850),
			rw("w2.0", verify.OpRead, verify.ResourceNaive, verify.OutcomeOK, "B", 11, 1, 460, 461),
			rw("w2.0", verify.OpWrite, verify.ResourceNaive, verify.OutcomeOK, "B", 11, 2, 470, 471),
			final(verify.ResourceNaive, 2, 1),
		}
		f := check(t, evs)
		if got := f.Naive.Linearizable; got != "Ok" {
			t.Errorf("got %s, want Ok: the killed write may have happened", got)
		}
		if got := f.Naive.WritesUnknown; got != 1 {
			t.Errorf("got %d unknown writes, want 1", got)
		}
	})
}

func TestCheckValidity(t *testing.T) {
	base := []verify.Event{
		spawn("w1.0", 1), spawn("w2.0", 2),
		grant("w1.0", "A", 10, 0, 10, 400),
		release("w1.0", "A", 10, 100, 101),
		grant("w2.0", "B", 11, 200, 210, 610),
		release("w2.0", "B", 11, 300, 301),
	}
	quiet := func(evs []verify.Event, workers ...int) []verify.Event {
		for i, w := range workers {
			g := grant("w"+string(rune('0'+w))+".0", "Q"+string(rune('0'+w)), uint64(20+i), 1000+int64(i)*100, 1010+int64(i)*100, 1400+int64(i)*100)
			g.Phase = "quiet"
			evs = append(evs, g, release(g.Proc, g.Owner, g.Fence, 1050+int64(i)*100, 1051+int64(i)*100))
		}
		return evs
	}
	// clean returns base with quiet grants of both workers, then evs.
	clean := func(evs ...verify.Event) []verify.Event {
		return append(quiet(slices.Clone(base), 1, 2), evs...)
	}
	// wantInvalid fails t unless f's verdict is INVALID for a reason
	// that says why.
	wantInvalid := func(t *testing.T, f *verify.Findings, why string) {
		t.Helper()
		if f.Verdict() != "INVALID" || !strings.Contains(strings.Join(f.Invalid, ";"), why) {
			t.Errorf("got %s %q, want INVALID: %s", f.Verdict(), f.Invalid, why)
		}
	}
	pause := func(owner string, start, end int64) verify.Event {
		return verify.Event{Proc: "nemesis", Op: verify.FaultPause, Target: "w1.0", Owner: owner, InvokeNs: start * ms, CompleteNs: end * ms, Outcome: verify.OutcomeOK}
	}

	t.Run("clean", func(t *testing.T) {
		f := check(t, clean())
		if got := f.Verdict(); got != "PASS" {
			t.Errorf("got %s (%q %q), want PASS", got, f.Violations(), f.Invalid)
		}
	})
	t.Run("worker without a quiet grant", func(t *testing.T) {
		f := check(t, quiet(slices.Clone(base), 1))
		if !slices.Equal(f.QuietMissing, []int{2}) || f.Verdict() != "FAIL" {
			t.Errorf("got quiet missing %v, verdict %s; want [2], FAIL", f.QuietMissing, f.Verdict())
		}
	})
	t.Run("fault never injected", func(t *testing.T) {
		f := check(t, clean(), verify.FaultPause)
		wantInvalid(t, f, "never injected")
	})
	t.Run("pause without a holder", func(t *testing.T) {
		f := check(t, clean(pause("", 500, 900)), verify.FaultPause)
		wantInvalid(t, f, "never had an effect")
	})
	t.Run("pause with a takeover", func(t *testing.T) {
		f := check(t, clean(pause("A", 50, 250)), verify.FaultPause)
		if len(f.Faults) != 1 || !f.Faults[0].Effective {
			t.Fatalf("got faults %+v, want one effective pause", f.Faults)
		}
		if !slices.Equal(f.Liveness, []time.Duration{160 * time.Millisecond}) {
			t.Errorf("got liveness %v, want [160ms]", f.Liveness)
		}
		// No naive register in this history: the negative-control rule
		// does not apply.
		if got := f.Verdict(); got != "PASS" {
			t.Errorf("got %s (%q %q), want PASS", got, f.Violations(), f.Invalid)
		}
	})
	// A server fault no operation failed under: it had an effect if an
	// operation invoked during the outage waited for its end, or, on one
	// node of a cluster, if the others granted or renewed while the node
	// was down (the quorum masked it); otherwise the run is invalid.
	serverFault := func(kind string, nodes int, downMs int64) verify.Event {
		return verify.Event{Proc: "nemesis", Op: kind, Target: "server n1", InvokeNs: 150 * ms, CompleteNs: 450 * ms,
			Outcome: verify.OutcomeOK, Value: downMs * ms, Nodes: nodes}
	}
	for _, tc := range []struct {
		name   string
		ev     verify.Event
		kind   string
		effect bool
	}{
		{"restart of the only node, unnoticed", serverFault(verify.FaultRestart, 1, 200), verify.FaultRestart, false},
		{"restart of one node of three, grant while it was down", serverFault(verify.FaultRestart, 3, 200), verify.FaultRestart, true},
		{"restart of one node of three, the grant began before", func() verify.Event {
			e := serverFault(verify.FaultRestart, 3, 200)
			e.InvokeNs = 205 * ms
			return e
		}(), verify.FaultRestart, false},
		{"pause of one node of three, the grant ended after it was back", serverFault(verify.FaultServerPause, 3, 50), verify.FaultServerPause, false},
		{"pause of the only node, the grant waited for it", func() verify.Event {
			e := serverFault(verify.FaultServerPause, 1, 55)
			e.InvokeNs = 195 * ms // down 195–203 ms: w2.0's grant, invoked at 200, waited until 210
			e.Value = 8 * ms
			return e
		}(), verify.FaultServerPause, true},
		{"blackhole of one proxy of five", func() verify.Event {
			e := serverFault(verify.FaultProxy, 5, 200)
			e.Detail = "blackhole for 200ms"
			return e
		}(), verify.FaultProxy, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The only worker operation in the window: w2.0's grant, 200–210 ms.
			f := check(t, clean(tc.ev), tc.kind)
			if len(f.Faults) != 1 || f.Faults[0].Effective != tc.effect {
				t.Fatalf("got faults %+v, want one with effective %v", f.Faults, tc.effect)
			}
			want := "PASS"
			if !tc.effect {
				want = "INVALID"
			}
			if got := f.Verdict(); got != want {
				t.Errorf("got %s (%q %q), want %s", got, f.Violations(), f.Invalid, want)
			}
		})
	}
	// A delay longer than the client's per-node timeout shows as failures,
	// not as slow releases.
	t.Run("delay seen as failures", func(t *testing.T) {
		delay := verify.Event{Proc: "nemesis", Op: verify.FaultProxy, Target: "proxy to n1,n2", InvokeNs: 150 * ms, CompleteNs: 950 * ms,
			Outcome: verify.OutcomeOK, Value: 80 * ms, Nodes: 3, Detail: "delay 80ms per chunk for 800ms"}
		failed := verify.Event{Proc: "w2.0", Op: verify.OpRenew, Key: "k", InvokeNs: 400 * ms, CompleteNs: 400 * ms,
			Outcome: verify.OutcomeFail, Fence: 11, Owner: "B", Err: "quorum not reached"}
		for _, tc := range []struct {
			evs    []verify.Event
			effect bool
		}{
			{[]verify.Event{delay}, false},
			{[]verify.Event{delay, failed}, true},
		} {
			f := check(t, clean(tc.evs...), verify.FaultProxy)
			if len(f.Faults) != 1 || f.Faults[0].Effective != tc.effect {
				t.Errorf("with %d events: got faults %+v, want one with effective %v", len(tc.evs), f.Faults, tc.effect)
			}
		}
	})
	t.Run("pause after the holder began its release", func(t *testing.T) {
		// A began its release at 100 ms; B's grant at 210 ms follows the
		// release, not the pause.
		f := check(t, clean(pause("A", 120, 250)), verify.FaultPause)
		if len(f.Faults) != 1 || f.Faults[0].Effective {
			t.Fatalf("got faults %+v, want one ineffective pause", f.Faults)
		}
		wantInvalid(t, f, "never had an effect")
	})
	t.Run("negative control saw nothing", func(t *testing.T) {
		evs := clean(pause("A", 50, 250),
			rw("w2.0", verify.OpRead, verify.ResourceNaive, verify.OutcomeOK, "B", 11, 0, 220, 221),
			rw("w2.0", verify.OpWrite, verify.ResourceNaive, verify.OutcomeOK, "B", 11, 1, 230, 231),
			final(verify.ResourceNaive, 1, 1))
		f := check(t, evs, verify.FaultPause)
		wantInvalid(t, f, "negative control")
	})
}

func TestPairEvents(t *testing.T) {
	evs := verify.PairEvents([]verify.Event{
		{Proc: "w1.0", Seq: 1, Op: verify.OpWrite, InvokeNs: 10, Outcome: verify.OutcomeInvoke},
		{Proc: "w1.0", Seq: 2, Op: verify.OpRead, InvokeNs: 5, Outcome: verify.OutcomeInvoke},
		{Proc: "w1.0", Seq: 2, Op: verify.OpRead, InvokeNs: 5, CompleteNs: 8, Outcome: verify.OutcomeOK, Value: 3},
		{Proc: "coordinator", Op: verify.OpExit, Target: "w1.0", InvokeNs: 20, CompleteNs: 20},
		{Proc: "w2.0", Seq: 1, Op: verify.OpWrite, InvokeNs: 30, Outcome: verify.OutcomeInvoke},
	})
	if len(evs) != 4 {
		t.Fatalf("got %d events, want 4: %+v", len(evs), evs)
	}
	if e := evs[0]; e.Op != verify.OpRead || e.Outcome != verify.OutcomeOK || e.CompleteNs != 8 || e.Value != 3 {
		t.Errorf("got %+v, want the paired read", e)
	}
	if e := evs[1]; e.Op != verify.OpWrite || e.Outcome != verify.OutcomeInfo || e.CompleteNs != 20 {
		t.Errorf("got %+v, want the write as info, completed at the exit (20)", e)
	}
	if e := evs[3]; e.Outcome != verify.OutcomeInfo || e.CompleteNs != math.MaxInt64 {
		t.Errorf("got %+v, want the write as info, never completed", e)
	}
}

func TestReadHistory(t *testing.T) {
	dir := t.TempDir()
	if _, err := verify.ReadHistory(dir); err == nil {
		t.Errorf("empty directory: got no error, want one")
	}
	if err := os.WriteFile(filepath.Join(dir, "w1.0.jsonl"), []byte(`{"proc":"w1.0","op":"acquire","invokeNs":1,"completeNs":2,"outcome":"ok","fence":5,"owner":"A"}`+"\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := verify.ReadHistory(dir)
	if err != nil || len(evs) != 1 || evs[0].Fence != 5 {
		t.Fatalf("got %+v, %v; want one acquire with fence 5", evs, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "w2.0.jsonl"), []byte("{not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := verify.ReadHistory(dir); err == nil || !strings.Contains(err.Error(), "w2.0.jsonl:1") {
		t.Errorf("got %v, want an error naming w2.0.jsonl:1", err)
	}
}
