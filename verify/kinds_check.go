package verify

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"
)

// HoldFindings are the findings of a run of a kind other than the lock
// (Config.Kind). Findings.LeaseOverlaps then lists the holds that broke
// the kind's exclusion, each a grant made while the holds it conflicts
// with were certainly live (from the completion of their Acquire to their
// Lease.Expires or the invocation of their release):
//
//   - permits:N: a permit granted while N other permits were live, i.e.
//     more than N at once;
//   - rw: a read hold granted while a write hold was live, or a write
//     hold while any hold was live;
//   - election: a leadership granted while another was live.
//
// Findings.FenceRegressions checks the fences of the holds that write:
// every permit, every leadership, and every write hold, whose fence must
// be above the fence of every hold (readers' included) completed before it
// was invoked. Readers touch no register, so the register findings are
// the writers'.
type HoldFindings struct {
	Kind    string // "permits:N", "rw" or "election"
	Permits int    // permits:N: N

	Reads, Writes int // rw: read holds and write holds granted
	// MaxLive is the most holds certainly live at once in the workers'
	// histories (permits:N).
	MaxLive int
	// Example describes the first conflict of LeaseOverlaps.
	Example string `json:",omitempty"`

	// The server's view (permits:N, when the backend implements
	// dlock.Inspector): ServerChecks reads of the key's holds right after
	// a grant, ServerMax the most holds one listed, ServerExcess the reads
	// that listed more than Permits.
	ServerChecks, ServerMax, ServerExcess int
}

// checkKind fills the lock-exclusion findings of f (LeaseOverlaps,
// FenceRegressions, belief overlaps) for a run of a kind other than the
// lock, and f.Hold. It returns false, changing nothing, for a run of the
// lock: its acquisitions carry no Event.Hold.
func checkKind(f *Findings, evs []Event, leases []*lease) bool {
	h := &HoldFindings{}
	for _, e := range evs {
		if e.Op != OpAcquire || e.Outcome != OutcomeOK || e.Hold == "" {
			continue
		}
		switch e.Hold {
		case HoldPermit:
			h.Kind, h.Permits = KindPermits, max(h.Permits, int(e.Value))
		case HoldRead:
			h.Kind = KindRW
			h.Reads++
		case HoldWrite:
			h.Kind = KindRW
			h.Writes++
		case HoldLeader:
			h.Kind = KindElection
		}
	}
	if h.Kind == "" {
		return false
	}
	f.Hold = h
	all := func(*lease) bool { return true }
	switch h.Kind {
	case KindPermits:
		h.Kind += ":" + strconv.Itoa(h.Permits)
		f.LeaseOverlaps, h.MaxLive, h.Example = permitOverlaps(leases, h.Permits)
		f.FenceRegressions = holdRegressions(leases, all)
		f.CriticalSections, f.BeliefOverlaps = permitBeliefs(leases, h.Permits)
		for _, e := range evs {
			if e.Op != OpInspect || e.Outcome != OutcomeOK {
				continue
			}
			h.ServerChecks++
			h.ServerMax = max(h.ServerMax, int(e.Count))
			if int(e.Count) > h.Permits {
				h.ServerExcess++
			}
		}
	case KindRW:
		conflict := func(a, b *lease) bool { return a.hold == HoldWrite || b.hold == HoldWrite }
		f.LeaseOverlaps, h.Example = conflictOverlaps(leases, conflict)
		f.FenceRegressions = holdRegressions(leases, func(l *lease) bool { return l.hold == HoldWrite })
		f.CriticalSections, f.BeliefOverlaps = conflictBeliefs(leases, conflict)
	case KindElection:
		conflict := func(a, b *lease) bool { return true }
		f.LeaseOverlaps, h.Example = conflictOverlaps(leases, conflict)
		f.FenceRegressions = holdRegressions(leases, all)
		f.CriticalSections, f.BeliefOverlaps = conflictBeliefs(leases, conflict)
	}
	return true
}

// describe names a lease for messages: "w2.1 write hold (fence 7)".
func (l *lease) describe() string {
	return fmt.Sprintf("%s %s hold (fence %d)", l.Proc, l.hold, l.Fence)
}

// conflictOverlaps finds pairs of leases of different owners that
// conflict and were certainly live at the same time, and describes the
// first.
func conflictOverlaps(leases []*lease, conflict func(a, b *lease) bool) ([]Overlap, string) {
	var out []Overlap
	example := ""
	sweepLive(leases, func(l *lease, active []*lease) {
		for _, a := range active {
			if a.Owner != l.Owner && conflict(a, l) {
				o := Overlap{A: a.LeaseRef, B: l.LeaseRef, FromNs: l.GrantedNs, UntilNs: min(a.LiveNs, l.LiveNs)}
				if example == "" {
					example = fmt.Sprintf("%s granted while %s was live for %v more", l.describe(), a.describe(),
						time.Duration(o.UntilNs-o.FromNs).Round(time.Microsecond))
				}
				out = append(out, o)
			}
		}
	})
	return out, example
}

// sweepLive calls visit, in order, for each lease (sorted by GrantedNs)
// that was certainly live for some time, with the leases granted before it
// that were still certainly live when it was granted.
func sweepLive(leases []*lease, visit func(l *lease, active []*lease)) {
	var active []*lease
	for _, l := range leases { // by GrantedNs
		active = slices.DeleteFunc(active, func(a *lease) bool { return a.LiveNs <= l.GrantedNs })
		if l.LiveNs <= l.GrantedNs {
			continue
		}
		visit(l, active)
		active = append(active, l)
	}
}

// permitOverlaps finds permits granted while n permits of other owners
// were certainly live, and returns them, the most permits certainly live
// at once, and a description of the first. Each Overlap pairs the new
// permit (B) with the live permit that expires first (A), over the time
// all of them were live.
func permitOverlaps(leases []*lease, n int) ([]Overlap, int, string) {
	var out []Overlap
	most := 0
	example := ""
	sweepLive(leases, func(l *lease, active []*lease) {
		others := slices.DeleteFunc(slices.Clone(active), func(a *lease) bool { return a.Owner == l.Owner })
		most = max(most, len(others)+1)
		if len(others) >= n && n > 0 {
			first := slices.MinFunc(others, func(a, b *lease) int { return cmp.Compare(a.LiveNs, b.LiveNs) })
			o := Overlap{A: first.LeaseRef, B: l.LeaseRef, FromNs: l.GrantedNs, UntilNs: min(first.LiveNs, l.LiveNs)}
			if example == "" {
				example = fmt.Sprintf("%s granted while %d other permits were live, for %v", l.describe(), len(others),
					time.Duration(o.UntilNs-o.FromNs).Round(time.Microsecond))
			}
			out = append(out, o)
		}
	})
	return out, most, example
}

// holdRegressions finds the grants for which checked holds whose fence is
// not above the fence of every grant (of any hold) that completed before
// they were invoked (an equal fence from the same owner is allowed).
func holdRegressions(leases []*lease, checked func(*lease) bool) []Regression {
	byInvoke := slices.Clone(leases)
	sort.SliceStable(byInvoke, func(i, j int) bool { return byInvoke[i].invoke < byInvoke[j].invoke })
	var out []Regression
	var best *lease
	i := 0
	for _, g := range byInvoke {
		for i < len(leases) && leases[i].GrantedNs < g.invoke {
			if best == nil || leases[i].Fence > best.Fence {
				best = leases[i]
			}
			i++
		}
		if best == nil || !checked(g) {
			continue
		}
		if g.Fence < best.Fence || (g.Fence == best.Fence && g.Owner != best.Owner) {
			out = append(out, Regression{Earlier: best.LeaseRef, Later: g.LeaseRef})
		}
	}
	return out
}

// conflictBeliefs counts critical sections, and those that overlap a
// conflicting critical section of another owner as the workers saw them.
func conflictBeliefs(leases []*lease, conflict func(a, b *lease) bool) (total, overlapping int) {
	hit := make([]bool, len(leases))
	for i, a := range leases { // by GrantedNs
		for j := i + 1; j < len(leases); j++ {
			b := leases[j]
			if b.GrantedNs >= a.csEnd {
				break
			}
			if a.Owner != b.Owner && b.csEnd > b.GrantedNs && conflict(a, b) {
				hit[i], hit[j] = true, true
			}
		}
	}
	for _, h := range hit {
		if h {
			overlapping++
		}
	}
	return len(leases), overlapping
}

// permitBeliefs counts critical sections, and those that began while n
// critical sections of other owners were under way as the workers saw
// them.
func permitBeliefs(leases []*lease, n int) (total, overlapping int) {
	for i, l := range leases { // by GrantedNs
		others := 0
		for _, a := range leases[:i] {
			if a.Owner != l.Owner && a.csEnd > l.GrantedNs {
				others++
			}
		}
		if others >= n {
			overlapping++
		}
	}
	return len(leases), overlapping
}

// violations lists the broken exclusion claims of the kind, one line
// each; nil for a run of the lock (h nil).
func (h *HoldFindings) violations(f *Findings) []string {
	if h == nil {
		return nil
	}
	var out []string
	if n := len(f.LeaseOverlaps); n > 0 {
		what := map[string]string{KindRW: "read/write hold overlaps", KindElection: "overlapping leaderships"}[h.Kind]
		if what == "" {
			what = fmt.Sprintf("permits granted beyond %d (up to %d live at once)", h.Permits, h.MaxLive)
		}
		out = append(out, fmt.Sprintf("%d %s, e.g. %s", n, what, h.Example))
	}
	if h.ServerExcess > 0 {
		out = append(out, fmt.Sprintf("the server listed more than %d permit holds %d times (up to %d)", h.Permits, h.ServerExcess, h.ServerMax))
	}
	return out
}

// kind returns f.Hold.Kind, "" for a run of the lock (or nil f).
func (f *Findings) kind() string {
	if f == nil || f.Hold == nil {
		return ""
	}
	return f.Hold.Kind
}

// kindLegend explains, after the legend, the columns of rows whose
// backend is labelled with a kind ("redis [rw]").
const kindLegend = `- [permits:N], [rw], [election]: workers took one permit of an N-permit semaphore, a read-write lock's
  read hold (3 in 4, touching no register) or write hold, or an election's leadership. lease overlaps then
  counts permits granted while N others were certainly live (plus the server's listings of more than N
  holds), read holds overlapping a write hold or two write holds, or overlapping leaderships; fence
  regressions the writers', leaders' and permits' fences; the registers' columns are the writers'.
`

// takenFrom returns the first grant after from and not after until that
// shows the server had let holder's hold go, or nil. For the lock (h nil)
// and elections that is any grant to another owner; for a read-write lock,
// a write hold, or any hold when holder's was a write hold; for permits:N,
// a permit granted while N−1 permits of owners other than holder were
// certainly live, so that N others held at once.
func takenFrom(leases []*lease, h *HoldFindings, holder string, from, until int64) *lease {
	var victim *lease
	if h != nil && h.Kind == KindRW {
		victim = ownerLease(leases, holder, from)
	}
	var active []*lease
	for _, l := range leases { // by GrantedNs
		if l.GrantedNs > until {
			break
		}
		if l.Owner == holder {
			continue
		}
		active = slices.DeleteFunc(active, func(a *lease) bool { return a.LiveNs <= l.GrantedNs })
		if l.LiveNs > l.GrantedNs {
			active = append(active, l)
		}
		if l.GrantedNs <= from {
			continue
		}
		switch {
		case h == nil || h.Kind == KindElection:
			return l
		case h.Kind == KindRW:
			if l.hold == HoldWrite || victim == nil || victim.hold == HoldWrite {
				return l
			}
		case h.Permits > 0:
			if len(active) >= h.Permits {
				return l
			}
		default:
			return l
		}
	}
	return nil
}
