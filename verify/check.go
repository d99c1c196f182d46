package verify

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// CheckOptions configures Check.
type CheckOptions struct {
	// TTL is the lease TTL of the run. It bounds how long after a fault
	// window its effects are looked for. Required.
	TTL time.Duration

	// Faults are the fault kinds the run injected (FaultPause, ...). Each
	// must show at least one window with an effect, or the run is invalid.
	// Default none.
	Faults []string

	// LinearizabilityTimeout bounds porcupine's check of each register.
	// 0 means 60s; a check that times out reports "Unknown".
	LinearizabilityTimeout time.Duration

	// VisualizeDir, when set, receives porcupine's HTML timeline of each
	// register (fenced.html, naive.html) with the fault windows and the
	// leases drawn in.
	VisualizeDir string
}

// Findings are the results of checking one run's history.
type Findings struct {
	Grants           int          // successful acquisitions
	LeaseOverlaps    []Overlap    // (a) grants while another owner's lease was certainly live
	FenceRegressions []Regression // (b) later grants with a smaller or equal fence
	Fenced, Naive    *ResourceFindings

	CriticalSections int // (d) critical sections: grant to release, as the worker saw them
	BeliefOverlaps   int // critical sections overlapping another owner's

	Liveness        []time.Duration // (e) per effective fault: its start to the next grant by another owner
	LivenessMissing int             // effective faults never followed by such a grant
	QuietMissing    []int           // workers without a grant in the quiet phase

	Crashes []string       // worker processes that ended unexpectedly
	Faults  []FaultFinding // the fault windows
	Invalid []string       // why the run does not count (empty: it counts)

	// Hold describes a run of a kind other than the lock (Config.Kind);
	// LeaseOverlaps then lists conflicting holds, see HoldFindings.
	Hold *HoldFindings `json:",omitempty"`
}

// LeaseRef identifies one lease in Findings.
type LeaseRef struct {
	Proc      string // the worker process holding it
	Owner     string // its owner token
	Fence     uint64
	GrantedNs int64 // completion of the Acquire that returned it
	LiveNs    int64 // until when it was certainly live on the server
}

// Overlap is two leases of different owners certainly live on the server
// at the same time: a grant made while another owner's lease was live.
type Overlap struct {
	A, B            LeaseRef
	FromNs, UntilNs int64
}

// Regression is a grant whose fence is not greater than that of a grant
// that completed before it was invoked.
type Regression struct {
	Earlier, Later LeaseRef
}

// ResourceFindings describe one register.
type ResourceFindings struct {
	Name          string // ResourceFenced or ResourceNaive
	Reads         int
	ReadsRejected int // claims refused by the fenced register
	Writes        int
	WritesOK      int // acknowledged
	WritesStale   int // rejected by the fenced register: stale writes stopped
	WritesUnknown int
	// StaleAccepted counts acknowledged writes whose fence was older than
	// (or equal to, from another owner) the fence of a read or write of
	// the register that had completed before the write began.
	StaleAccepted int
	Increments    int64 // acknowledged increments in the register's log
	Final         int64 // the register's final value
	// LostUpdates is Increments − Final (at least 0): increments that a
	// concurrent read-modify-write overwrote. A lower bound when a
	// process died between its write and its log entry.
	LostUpdates int64
	// Linearizable is porcupine's verdict on the register's
	// read-modify-writes as atomic increments: "Ok", "Illegal",
	// "Unknown" (timed out) or "" (no operations).
	Linearizable  string
	Visualization string // the HTML timeline's path, if written
}

// FaultFinding is one fault window and whether it did what it should.
type FaultFinding struct {
	Kind      string
	Target    string // process or server hit
	Owner     string // the lease the target held, if any
	Detail    string
	StartNs   int64
	EndNs     int64
	Injected  bool
	Effective bool
	Why       string // how the effect was judged
}

// lease is a grant with what happened to it afterwards.
type lease struct {
	LeaseRef
	invoke   int64
	csEnd    int64 // end of the critical section as the worker saw it
	released bool
	hold     string // Event.Hold of its acquisition
}

// Check analyses a history (all processes' events, as ReadHistory returns
// them) and returns the findings. It never modifies evs.
func Check(evs []Event, opts CheckOptions) (*Findings, error) {
	if opts.TTL <= 0 {
		return nil, fmt.Errorf("verify: check: TTL %v must be positive", opts.TTL)
	}
	f := &Findings{}
	exits := map[string]int64{}
	workerOf := map[string]int{}
	var workers []int
	var lastNs int64
	for _, e := range evs {
		if e.CompleteNs != math.MaxInt64 {
			lastNs = max(lastNs, e.CompleteNs, e.InvokeNs)
		}
		switch e.Op {
		case OpSpawn:
			workerOf[e.Target] = e.Worker
			if !slices.Contains(workers, e.Worker) {
				workers = append(workers, e.Worker)
			}
		case OpExit:
			exits[e.Target] = e.CompleteNs
			if e.Outcome == OutcomeFail {
				f.Crashes = append(f.Crashes, fmt.Sprintf("%s: %s", e.Target, e.Err))
			}
		}
	}
	slices.Sort(workers)

	leases := collectLeases(evs, exits, lastNs)
	f.Grants = len(leases)
	if !checkKind(f, evs, leases) {
		f.LeaseOverlaps = leaseOverlaps(leases)
		f.FenceRegressions = fenceRegressions(leases)
		f.CriticalSections, f.BeliefOverlaps = beliefOverlaps(leases)
	}

	quiet := map[int]bool{}
	for _, e := range evs {
		if e.Op == OpAcquire && e.Outcome == OutcomeOK && e.Phase == "quiet" {
			quiet[workerOf[e.Proc]] = true
		}
	}
	for _, w := range workers {
		if !quiet[w] {
			f.QuietMissing = append(f.QuietMissing, w)
		}
	}

	var err error
	for _, name := range []string{ResourceFenced, ResourceNaive} {
		rf := resourceFindings(evs, name)
		if rf == nil {
			continue
		}
		if err = linearizability(evs, name, rf, leases, opts); err != nil {
			return nil, err
		}
		if name == ResourceFenced {
			f.Fenced = rf
		} else {
			f.Naive = rf
		}
	}

	f.Faults = faultFindings(evs, leases, opts.TTL, f.Hold)
	for _, w := range f.Faults {
		if !w.Injected || !w.Effective {
			continue
		}
		if d, ok := nextGrant(leases, w.StartNs, w.Owner, f.Hold); ok {
			f.Liveness = append(f.Liveness, d)
		} else {
			f.LivenessMissing++
		}
	}
	f.Invalid = invalidReasons(f, opts.Faults)
	return f, nil
}

func collectLeases(evs []Event, exits map[string]int64, lastNs int64) []*lease {
	byOwner := map[string]*lease{}
	var leases []*lease
	for _, e := range evs {
		if e.Op != OpAcquire || e.Outcome != OutcomeOK || e.Owner == "" {
			continue
		}
		l := &lease{
			LeaseRef: LeaseRef{Proc: e.Proc, Owner: e.Owner, Fence: e.Fence, GrantedNs: e.CompleteNs, LiveNs: e.ExpiresNs},
			invoke:   e.InvokeNs,
			csEnd:    math.MaxInt64,
			hold:     e.Hold,
		}
		if l.LiveNs == 0 {
			l.LiveNs = e.CompleteNs
		}
		leases = append(leases, l)
		byOwner[e.Owner] = l
	}
	for _, e := range evs {
		l := byOwner[e.Owner]
		if l == nil {
			continue
		}
		switch {
		case e.Op == OpRenew && e.Outcome == OutcomeOK && e.ExpiresNs > 0:
			l.LiveNs = max(l.LiveNs, e.ExpiresNs)
		case e.Op == OpRelease:
			// The server holds the lease at most until the release is
			// executed, which is after it is invoked: the lease is
			// certainly live only until the invocation.
			l.released = true
			l.csEnd = min(l.csEnd, e.InvokeNs)
		}
	}
	for _, l := range leases {
		if l.released {
			l.LiveNs = min(l.LiveNs, l.csEnd)
		} else if t, ok := exits[l.Proc]; ok {
			l.csEnd = t
		} else {
			l.csEnd = lastNs
		}
	}
	sort.SliceStable(leases, func(i, j int) bool { return leases[i].GrantedNs < leases[j].GrantedNs })
	return leases
}

// leaseOverlaps finds leases of different owners certainly live at the
// same time: [GrantedNs, LiveNs) intersecting.
func leaseOverlaps(leases []*lease) []Overlap {
	var out []Overlap
	var active []*lease
	for _, l := range leases { // by GrantedNs
		keep := active[:0]
		for _, a := range active {
			if a.LiveNs > l.GrantedNs {
				keep = append(keep, a)
			}
		}
		active = keep
		if l.LiveNs <= l.GrantedNs {
			continue
		}
		for _, a := range active {
			if a.Owner != l.Owner {
				out = append(out, Overlap{A: a.LeaseRef, B: l.LeaseRef, FromNs: l.GrantedNs, UntilNs: min(a.LiveNs, l.LiveNs)})
			}
		}
		active = append(active, l)
	}
	return out
}

// fenceRegressions finds grants whose fence is not above the fence of
// every grant that completed before they were invoked (an equal fence
// from the same owner is a reentrant grant and allowed).
func fenceRegressions(leases []*lease) []Regression {
	return holdRegressions(leases, func(*lease) bool { return true })
}

// beliefOverlaps counts critical sections, and those that overlap another
// owner's critical section.
func beliefOverlaps(leases []*lease) (total, overlapping int) {
	return conflictBeliefs(leases, func(a, b *lease) bool { return true })
}

func resourceFindings(evs []Event, name string) *ResourceFindings {
	rf := &ResourceFindings{Name: name}
	type seen struct {
		complete int64
		fence    uint64
		owner    string
	}
	var seenOps []seen
	var writes []Event
	found := false
	for _, e := range evs {
		if e.Key != name {
			continue
		}
		switch e.Op {
		case OpRead:
			found = true
			rf.Reads++
			switch e.Outcome {
			case OutcomeStale:
				rf.ReadsRejected++
			case OutcomeOK:
				seenOps = append(seenOps, seen{e.CompleteNs, e.Fence, e.Owner})
			}
		case OpWrite:
			found = true
			rf.Writes++
			switch e.Outcome {
			case OutcomeOK:
				rf.WritesOK++
				seenOps = append(seenOps, seen{e.CompleteNs, e.Fence, e.Owner})
				writes = append(writes, e)
			case OutcomeStale:
				rf.WritesStale++
			default:
				rf.WritesUnknown++
			}
		case OpFinal:
			found = true
			rf.Final = e.Value
			rf.Increments = e.Count
			rf.LostUpdates = max(0, e.Count-e.Value)
		}
	}
	if !found {
		return nil
	}
	sort.Slice(seenOps, func(i, j int) bool { return seenOps[i].complete < seenOps[j].complete })
	sort.SliceStable(writes, func(i, j int) bool { return writes[i].InvokeNs < writes[j].InvokeNs })
	var best *seen
	i := 0
	for _, w := range writes {
		for i < len(seenOps) && seenOps[i].complete < w.InvokeNs {
			if best == nil || seenOps[i].fence > best.fence {
				best = &seenOps[i]
			}
			i++
		}
		if best != nil && (w.Fence < best.fence || (w.Fence == best.fence && w.Owner != best.owner)) {
			rf.StaleAccepted++
		}
	}
	return rf
}

// faultFindings judges every fault window of the injector.
// For a kind other than the lock (h not nil), a pause has its effect only
// when the grants made while the holder was stopped show that the server
// let its hold go (takenFrom).
func faultFindings(evs []Event, leases []*lease, ttl time.Duration, h *HoldFindings) []FaultFinding {
	var out []FaultFinding
	for _, e := range evs {
		if !slices.Contains(faultNames, e.Op) || e.Op == FaultNone {
			continue
		}
		w := FaultFinding{Kind: e.Op, Target: e.Target, Owner: e.Owner, Detail: e.Detail, StartNs: e.InvokeNs, EndNs: e.CompleteNs, Injected: e.Outcome == OutcomeOK}
		if !w.Injected {
			w.Why = "not injected: " + e.Err
			out = append(out, w)
			continue
		}
		switch w.Kind {
		case FaultPause:
			if w.Owner == "" {
				w.Why = "the paused process held no lease"
				break
			}
			// The injector learns who holds the lock from the workers'
			// output, so the stop can land just after the holder began to
			// release it; the next grant then proves nothing.
			if l := ownerLease(leases, w.Owner, w.StartNs); l != nil && l.released && l.csEnd <= w.StartNs {
				w.Why = "the holder had begun its release before it was stopped"
				break
			}
			if l := takenFrom(leases, h, w.Owner, w.StartNs, w.EndNs); l != nil {
				w.Effective = true
				w.Why = fmt.Sprintf("%s took the lock (fence %d) while the holder was stopped", l.Proc, l.Fence)
			}
			if !w.Effective {
				w.Why = "nobody took the lock while the holder was stopped"
			}
		case FaultKill:
			w.Effective = w.Owner != ""
			if w.Effective {
				w.Why = "killed while holding fence " + strconv.FormatUint(leaseFence(leases, w.Owner), 10)
			} else {
				w.Why = "the killed process held no lease"
			}
		case FaultProxy:
			switch {
			case strings.HasPrefix(w.Detail, "reset"):
				w.Effective = e.Count > 0
				w.Why = fmt.Sprintf("%d connections reset", e.Count)
			case strings.HasPrefix(w.Detail, "delay"):
				// A client whose per-node timeout is below the delay
				// (Redlock's) sees failures instead of slow operations.
				if w.Effective, w.Why = slowOps(evs, w, time.Duration(e.Value)); !w.Effective {
					w.Effective, w.Why = failedOps(evs, w, ttl)
				}
			default:
				w.Effective, w.Why = outageOps(evs, w, ttl, e)
			}
		default: // restart, restart-persist, server-pause
			w.Effective, w.Why = outageOps(evs, w, ttl, e)
		}
		out = append(out, w)
	}
	return out
}

// ownerLease returns the last lease of owner granted by ns, or nil.
func ownerLease(leases []*lease, owner string, ns int64) *lease {
	var last *lease
	for _, l := range leases {
		if l.Owner == owner && l.GrantedNs <= ns && (last == nil || l.GrantedNs > last.GrantedNs) {
			last = l
		}
	}
	return last
}

func leaseFence(leases []*lease, owner string) uint64 {
	for _, l := range leases {
		if l.Owner == owner {
			return l.Fence
		}
	}
	return 0
}

// failedOps reports whether a worker saw the fault: a failed or unknown
// lock operation, a failed renewal or a lost lease during the window or
// within a TTL after it.
func failedOps(evs []Event, w FaultFinding, ttl time.Duration) (bool, string) {
	until := w.EndNs + int64(ttl)
	for _, e := range evs {
		if !strings.HasPrefix(e.Proc, "w") || e.InvokeNs > until || e.CompleteNs < w.StartNs {
			continue
		}
		switch {
		case e.Op == OpLost:
			return true, fmt.Sprintf("%s lost fence %d", e.Proc, e.Fence)
		case e.Op == OpRenew && e.Outcome == OutcomeFail:
			return true, fmt.Sprintf("%s failed to renew fence %d", e.Proc, e.Fence)
		case (e.Op == OpAcquire || e.Op == OpRelease) && e.Outcome == OutcomeInfo:
			return true, fmt.Sprintf("%s: %s failed: %s", e.Proc, e.Op, e.Err)
		}
	}
	return false, "no worker operation failed during the window"
}

// outageOps judges a window in which nodes were unreachable (restart,
// server pause, blackhole; e is its event): the workers noticed if an
// operation failed (failedOps) or waited for the nodes to come back
// (stalledOps); on a cluster the others may have carried on without them
// (quorumOps).
func outageOps(evs []Event, w FaultFinding, ttl time.Duration, e Event) (bool, string) {
	down := time.Duration(e.Value)
	if ok, why := failedOps(evs, w, ttl); ok {
		return true, why
	}
	if ok, why := stalledOps(evs, w, down); ok {
		return true, why
	}
	if e.Nodes > 1 {
		return quorumOps(evs, w, down)
	}
	return false, "no worker operation failed or waited for the server"
}

// stalledOps reports whether a lock operation invoked while the nodes were
// certainly unreachable completed successfully only after they came back:
// a client that retries (etcd, ZooKeeper) or waits shows the outage that
// way instead of failing.
func stalledOps(evs []Event, w FaultFinding, down time.Duration) (bool, string) {
	back := w.StartNs + int64(down)
	for _, e := range evs {
		if !strings.HasPrefix(e.Proc, "w") || (e.Op != OpAcquire && e.Op != OpRelease) || e.Outcome != OutcomeOK ||
			e.InvokeNs < w.StartNs || e.InvokeNs >= back || e.CompleteNs <= back {
			continue
		}
		return true, fmt.Sprintf("%s: %s invoked during the outage completed %v later, after it", e.Proc, e.Op,
			time.Duration(e.CompleteNs-e.InvokeNs).Round(time.Millisecond))
	}
	return false, "no lock operation waited for the server"
}

// quorumOps reports, for a fault on some nodes of a cluster that no worker
// noticed (a quorum backend masks a minority), whether the others carried
// on without them: a grant or renewal that began and ended while the nodes
// were certainly unreachable (down from the window's start). Those nodes
// missed it — a restarted one comes back without that lease, a paused one
// holds a stale view — which is the fault's effect on a quorum.
func quorumOps(evs []Event, w FaultFinding, down time.Duration) (bool, string) {
	until := w.StartNs + int64(down)
	for _, e := range evs {
		if !strings.HasPrefix(e.Proc, "w") || e.Outcome != OutcomeOK || e.InvokeNs < w.StartNs || e.CompleteNs > until {
			continue
		}
		if e.Op == OpAcquire || e.Op == OpRenew {
			return true, fmt.Sprintf("the other nodes carried on: %s %s fence %d while the node was unreachable", e.Proc, opPast[e.Op], e.Fence)
		}
	}
	return false, "no worker operation failed, and no grant or renewal completed while the node was unreachable"
}

var opPast = map[string]string{OpAcquire: "was granted", OpRenew: "renewed"}

// slowOps reports whether a release in the window took at least delay.
func slowOps(evs []Event, w FaultFinding, delay time.Duration) (bool, string) {
	for _, e := range evs {
		if e.Op == OpRelease && e.InvokeNs >= w.StartNs && e.InvokeNs <= w.EndNs && e.CompleteNs != math.MaxInt64 &&
			time.Duration(e.CompleteNs-e.InvokeNs) >= delay {
			return true, fmt.Sprintf("%s: a release took %v", e.Proc, time.Duration(e.CompleteNs-e.InvokeNs).Round(time.Millisecond))
		}
	}
	return false, "no release in the window was slowed down"
}

// nextGrant returns the time from start to the first grant to an owner
// other than holder completing after start.
func nextGrant(leases []*lease, start int64, holder string, h *HoldFindings) (time.Duration, bool) {
	if l := takenFrom(leases, h, holder, start, math.MaxInt64); l != nil {
		return time.Duration(l.GrantedNs - start), true
	}
	return 0, false
}

func invalidReasons(f *Findings, kinds []string) []string {
	var out []string
	if f.Grants == 0 {
		out = append(out, "no worker ever acquired the lock")
	}
	for _, k := range kinds {
		if k == FaultNone {
			continue
		}
		injected, effective := 0, 0
		for _, w := range f.Faults {
			if w.Kind != k || !w.Injected {
				continue
			}
			injected++
			if w.Effective {
				effective++
			}
		}
		switch {
		case injected == 0:
			out = append(out, fmt.Sprintf("fault %s was never injected", k))
		case effective == 0:
			out = append(out, fmt.Sprintf("fault %s was injected %d times and never had an effect", k, injected))
		}
	}
	if slices.Contains(kinds, FaultPause) && f.Naive != nil && f.Naive.LostUpdates == 0 && f.Naive.StaleAccepted == 0 && f.Naive.Linearizable != "Illegal" {
		out = append(out, "the negative control (naive register) shows no violation under pauses: the pauses missed the read-modify-writes")
	}
	return out
}

// Violations lists the broken safety and liveness claims, one line each.
// Violations on the naive register are expected (it is the negative
// control) and not listed.
func (f *Findings) Violations() []string {
	out := f.Hold.violations(f)
	if n := len(f.LeaseOverlaps); n > 0 && f.Hold == nil {
		o := f.LeaseOverlaps[0]
		out = append(out, fmt.Sprintf("%d lease overlaps, e.g. %s (fence %d) granted while %s (fence %d) was live for %v more",
			n, o.B.Proc, o.B.Fence, o.A.Proc, o.A.Fence, time.Duration(o.UntilNs-o.FromNs).Round(time.Microsecond)))
	}
	if n := len(f.FenceRegressions); n > 0 {
		r := f.FenceRegressions[0]
		out = append(out, fmt.Sprintf("%d fence regressions, e.g. %s got fence %d after %s got %d", n, r.Later.Proc, r.Later.Fence, r.Earlier.Proc, r.Earlier.Fence))
	}
	if r := f.Fenced; r != nil {
		if r.StaleAccepted > 0 {
			out = append(out, fmt.Sprintf("fenced register accepted %d stale writes", r.StaleAccepted))
		}
		if r.LostUpdates > 0 {
			out = append(out, fmt.Sprintf("fenced register lost %d updates", r.LostUpdates))
		}
		if r.Linearizable == "Illegal" {
			out = append(out, "fenced register history is not linearizable")
		}
	}
	if len(f.QuietMissing) > 0 {
		out = append(out, fmt.Sprintf("workers %v did not acquire the lock in the quiet phase", f.QuietMissing))
	}
	for _, c := range f.Crashes {
		out = append(out, "worker crashed: "+c)
	}
	return out
}

// Verdict returns "FAIL" when Violations is not empty, else "INVALID"
// when the run does not count (Invalid), else "PASS".
func (f *Findings) Verdict() string {
	switch {
	case len(f.Violations()) > 0:
		return "FAIL"
	case len(f.Invalid) > 0:
		return "INVALID"
	}
	return "PASS"
}
