package verify

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// RunResult is one run of one experiment.
type RunResult struct {
	Backend  string        // Config.Name
	Fault    string        // the experiment, e.g. "pause" or "pause+kill"
	FIFO     bool          // the workers acquired with dlock.WithFIFO() (Config.FIFO)
	Seed     int64         // replays the fault schedule
	Duration time.Duration // the fault phase
	TTL      time.Duration // the workers' lease TTL (Config.TTL)
	Elapsed  time.Duration // the whole run, servers included
	Dir      string        // the run's directory under Config.OutDir
	Findings *Findings
}

// Verdict is Findings.Verdict.
func (r *RunResult) Verdict() string { return r.Findings.Verdict() }

// Label is the backend's name as the report shows it: Backend, with
// " (FIFO)" appended for a run whose workers acquired with dlock.WithFIFO().
func (r *RunResult) Label() string { return kindLabel(label(r.Backend, r.FIFO), r.Findings.kind()) }

func label(backend string, fifo bool) string {
	if fifo {
		return backend + " (FIFO)"
	}
	return backend
}

// Row sums up the runs of one backend × experiment.
type Row struct {
	Backend, Fault string
	FIFO           bool   // the runs acquired with dlock.WithFIFO()
	Kind           string // HoldFindings.Kind of the runs, "" for the lock
	Runs           int
	Seconds        float64 // total fault-phase time
	Grants         int
	LeaseOverlaps  int
	FenceRegress   int
	// Fenced register.
	FencedStaleAccepted, FencedStaleRejected int
	FencedLost                               int64
	FencedIllegal                            int // runs whose fenced history was not linearizable
	// Naive register (the negative control).
	NaiveStaleAccepted int
	NaiveLost          int64
	NaiveIllegal       int
	// Belief overlap: critical sections overlapping another owner's.
	CriticalSections, BeliefOverlaps int
	// Liveness after effective faults.
	LivenessP50, LivenessP99 time.Duration
	LivenessSamples          int
	FaultsInjected           int
	FaultsEffective          int
	Failed, Invalid          int // runs
}

// Verdict is "FAIL" if a run failed, else "INVALID" if a run was invalid,
// else "PASS".
func (r Row) Verdict() string {
	switch {
	case r.Failed > 0:
		return "FAIL"
	case r.Invalid > 0:
		return "INVALID"
	}
	return "PASS"
}

// Report holds the results of Run.
type Report struct {
	OutDir string // Config.OutDir: links in Markdown are relative to it
	Runs   []*RunResult
}

// OK reports whether every run passed (none failed or was invalid).
func (r *Report) OK() bool {
	for _, run := range r.Runs {
		if run.Verdict() != "PASS" {
			return false
		}
	}
	return len(r.Runs) > 0
}

// Merge returns a Report with the runs of r and others, for a table over
// several calls of Run (e.g. one per backend).
func (r *Report) Merge(others ...*Report) *Report {
	out := &Report{OutDir: r.OutDir, Runs: slices.Clone(r.Runs)}
	for _, o := range others {
		if o != nil {
			out.Runs = append(out.Runs, o.Runs...)
		}
	}
	return out
}

// SummaryFile is the name of the file, in each run's directory, that holds
// its RunResult as JSON.
const SummaryFile = "summary.json"

// ReadReport reads the RunResults that earlier calls of Run wrote below
// dirs (each an OutDir, or any directory above runs' directories), for one
// table over campaigns run by separate processes. The runs are ordered by
// the position of their dir in dirs, then by backend (runs without FIFO
// first), then experiment (in the order of FaultNames, by its first
// fault), then seed. OutDir is dirs[0]. Reading no run at all is an error.
func ReadReport(dirs ...string) (*Report, error) {
	type keyed struct {
		dir int
		run *RunResult
	}
	var all []keyed
	for i, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != SummaryFile {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			var r RunResult
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if r.Findings == nil {
				return fmt.Errorf("%s: no findings", path)
			}
			all = append(all, keyed{i, &r})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("verify: read report: %w", err)
		}
	}
	if len(all) == 0 {
		return nil, errors.New("verify: read report: no " + SummaryFile + " below " + strings.Join(dirs, ", "))
	}
	rank := func(fault string) int {
		first, _, _ := strings.Cut(fault, "+")
		if i := slices.Index(faultNames, first); i >= 0 {
			return i
		}
		return len(faultNames)
	}
	slices.SortStableFunc(all, func(a, b keyed) int {
		fifo := func(r *RunResult) int {
			if r.FIFO {
				return 1
			}
			return 0
		}
		return cmp.Or(cmp.Compare(a.dir, b.dir), cmp.Compare(a.run.Backend, b.run.Backend), cmp.Compare(fifo(a.run), fifo(b.run)),
			cmp.Compare(rank(a.run.Fault), rank(b.run.Fault)), cmp.Compare(a.run.Fault, b.run.Fault),
			cmp.Compare(a.run.Seed, b.run.Seed))
	})
	rep := &Report{OutDir: dirs[0]}
	for _, k := range all {
		rep.Runs = append(rep.Runs, k.run)
	}
	return rep, nil
}

// Rows sums the runs up per backend × experiment (FIFO runs apart from
// the others), in order of first appearance.
func (r *Report) Rows() []Row {
	var rows []Row
	var lat [][]time.Duration
	type rowKey struct {
		backend, fault string
		fifo           bool
		kind           string
	}
	index := map[rowKey]int{}
	for _, run := range r.Runs {
		k := rowKey{run.Backend, run.Fault, run.FIFO, run.Findings.kind()}
		i, ok := index[k]
		if !ok {
			i = len(rows)
			index[k] = i
			rows = append(rows, Row{Backend: run.Backend, Fault: run.Fault, FIFO: run.FIFO, Kind: k.kind})
			lat = append(lat, nil)
		}
		row := &rows[i]
		f := run.Findings
		row.Runs++
		row.Seconds += run.Duration.Seconds()
		row.Grants += f.Grants
		row.LeaseOverlaps += len(f.LeaseOverlaps)
		if f.Hold != nil {
			row.LeaseOverlaps += f.Hold.ServerExcess
		}
		row.FenceRegress += len(f.FenceRegressions)
		if x := f.Fenced; x != nil {
			row.FencedStaleAccepted += x.StaleAccepted
			row.FencedStaleRejected += x.WritesStale
			row.FencedLost += x.LostUpdates
			if x.Linearizable == "Illegal" {
				row.FencedIllegal++
			}
		}
		if x := f.Naive; x != nil {
			row.NaiveStaleAccepted += x.StaleAccepted
			row.NaiveLost += x.LostUpdates
			if x.Linearizable == "Illegal" {
				row.NaiveIllegal++
			}
		}
		row.CriticalSections += f.CriticalSections
		row.BeliefOverlaps += f.BeliefOverlaps
		lat[i] = append(lat[i], f.Liveness...)
		for _, w := range f.Faults {
			if w.Injected {
				row.FaultsInjected++
			}
			if w.Effective {
				row.FaultsEffective++
			}
		}
		switch f.Verdict() {
		case "FAIL":
			row.Failed++
		case "INVALID":
			row.Invalid++
		}
	}
	for i := range rows {
		rows[i].LivenessSamples = len(lat[i])
		rows[i].LivenessP50 = percentile(lat[i], 50)
		rows[i].LivenessP99 = percentile(lat[i], 99)
	}
	return rows
}

// percentile returns the p-th percentile (nearest rank), 0 without data.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := (p*len(s) + 99) / 100
	return s[max(rank-1, 0)]
}

var tableHeader = []string{
	"backend", "fault", "runs", "seconds", "grants", "lease overlaps", "fence regressions",
	"fenced stale acc/rej", "fenced lost", "naive stale acc", "naive lost", "belief overlap",
	"liveness p50", "liveness p99", "faults eff/inj", "verdict",
}

func (row Row) cells() []string {
	rate := "-"
	if row.CriticalSections > 0 {
		rate = fmt.Sprintf("%.1f%%", 100*float64(row.BeliefOverlaps)/float64(row.CriticalSections))
	}
	dur := func(d time.Duration) string {
		if row.LivenessSamples == 0 {
			return "-"
		}
		return d.Round(time.Millisecond).String()
	}
	verdict := row.Verdict()
	if row.Failed > 0 || row.Invalid > 0 {
		verdict += fmt.Sprintf(" (%d failed, %d invalid)", row.Failed, row.Invalid)
	}
	return []string{
		kindLabel(label(row.Backend, row.FIFO), row.Kind), row.Fault, fmt.Sprint(row.Runs), fmt.Sprintf("%.0f", row.Seconds), fmt.Sprint(row.Grants),
		fmt.Sprint(row.LeaseOverlaps), fmt.Sprint(row.FenceRegress),
		fmt.Sprintf("%d/%d", row.FencedStaleAccepted, row.FencedStaleRejected), fmt.Sprint(row.FencedLost),
		fmt.Sprint(row.NaiveStaleAccepted), fmt.Sprint(row.NaiveLost), rate,
		dur(row.LivenessP50), dur(row.LivenessP99),
		fmt.Sprintf("%d/%d", row.FaultsEffective, row.FaultsInjected), verdict,
	}
}

// Table returns the summary as an aligned plain-text table, one row per
// backend × experiment, followed by the violations and invalid runs.
func (r *Report) Table() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(tableHeader, "\t"))
	for _, row := range r.Rows() {
		fmt.Fprintln(tw, strings.Join(row.cells(), "\t"))
	}
	tw.Flush()
	b.WriteString(r.problems(false))
	return b.String()
}

// Markdown returns the summary as a markdown table with a legend, the
// violations and invalid runs, and links to each run's timelines
// (relative to OutDir when they lie below it).
func (r *Report) Markdown() string {
	base := r.OutDir
	var b strings.Builder
	b.WriteString("| " + strings.Join(tableHeader, " | ") + " |\n")
	b.WriteString("|" + strings.Repeat("---|", len(tableHeader)) + "\n")
	for _, row := range r.Rows() {
		b.WriteString("| " + strings.Join(row.cells(), " | ") + " |\n")
	}
	b.WriteString(legend)
	if slices.ContainsFunc(r.Runs, func(run *RunResult) bool { return run.Findings.kind() != "" }) {
		b.WriteString(kindLegend)
	}
	b.WriteString(r.problems(true))
	b.WriteString("\n### Runs\n\n")
	for _, run := range r.Runs {
		fmt.Fprintf(&b, "- %s / %s, seed %d: %s, %d grants", run.Label(), run.Fault, run.Seed, run.Verdict(), run.Findings.Grants)
		for _, x := range []*ResourceFindings{run.Findings.Fenced, run.Findings.Naive} {
			if x == nil {
				continue
			}
			if x.Linearizable != "" {
				fmt.Fprintf(&b, ", %s register linearizable: %s", x.Name, x.Linearizable)
			}
			if x.Visualization == "" {
				continue
			}
			p := x.Visualization
			if base != "" {
				if rel, err := filepath.Rel(base, p); err == nil {
					p = rel
				}
			}
			fmt.Fprintf(&b, ", [%s timeline](%s)", x.Name, filepath.ToSlash(p))
		}
		b.WriteString("\n")
	}
	return b.String()
}

const legend = `
- lease overlaps: grants made while another owner's lease was certainly live on the server (from the
  grant's completion to the holder's last renewal invocation + TTL − drift, i.e. Lease.Expires, or its
  release). Must be 0.
- fence regressions: grants whose fence was not above that of a grant completed before they began. Must be 0.
- fenced stale acc/rej: writes the fenced register accepted although a newer fence had already read or
  written it (must be 0) / writes it rejected as stale (the fence at work).
- fenced lost, naive lost: acknowledged increments missing from the register's final value.
- naive stale acc: the same as above for the unfenced register, the negative control (expected > 0 under pauses).
- belief overlap: critical sections (grant to release, as the workers saw them) overlapping another owner's.
- liveness: from the start of each effective fault to the next grant to another owner.
- faults eff/inj: fault windows that had their effect / windows injected. A run in which a fault never had
  an effect, or the negative control saw nothing under pauses, is INVALID, not passed.
`

// problems lists violations and invalid runs.
func (r *Report) problems(md bool) string {
	var b strings.Builder
	for _, run := range r.Runs {
		f := run.Findings
		vs := f.Violations()
		if len(vs) == 0 && len(f.Invalid) == 0 {
			continue
		}
		if md {
			fmt.Fprintf(&b, "\n**%s / %s, seed %d: %s** (%s)\n", run.Label(), run.Fault, run.Seed, f.Verdict(), run.Dir)
		} else {
			fmt.Fprintf(&b, "\n%s / %s, seed %d: %s (%s)\n", run.Label(), run.Fault, run.Seed, f.Verdict(), run.Dir)
		}
		for _, v := range vs {
			fmt.Fprintf(&b, "- violation: %s\n", v)
		}
		for _, v := range f.Invalid {
			fmt.Fprintf(&b, "- invalid: %s\n", v)
		}
	}
	return b.String()
}
