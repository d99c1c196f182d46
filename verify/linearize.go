package verify

import (
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The linearizability check treats each critical section's
// read-modify-write of a register as one operation, from the read's
// invocation to the write's completion: an atomic increment. If the lock
// (or, for the fenced register, the fence) kept read-modify-writes apart,
// the history is linearizable; a lost update makes it illegal.
//
// The fenced register's state also holds the highest fence and its owner,
// so a claim (the fenced read) is legal only when its fence is accepted,
// and a rejected claim only when it is not. A write the register rejected
// is an increment that aborted: legal, with no effect but its claim.

// rmwInput is the operation's invariant part.
type rmwInput struct {
	Proc  string
	Fence uint64
	Owner string
}

// rmwOutput is what the operation observed.
type rmwOutput struct {
	Read  string // OutcomeOK, OutcomeStale, OutcomeInfo
	Value int64  // the value read
	Write string // OutcomeOK, OutcomeStale, OutcomeInfo, or "" (no write)
}

// regState is the register: value, highest fence and its owner (the
// naive register keeps only the value).
type regState struct {
	V int64
	F uint64
	O string
}

func registerModel(fenced bool) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{regState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			s, in, out := state.(regState), input.(rmwInput), output.(rmwOutput)
			if !fenced {
				switch {
				case out.Read != OutcomeOK:
					return []interface{}{s}
				case out.Value != s.V:
					return nil
				case out.Write == OutcomeOK:
					return []interface{}{regState{V: s.V + 1}}
				case out.Write == OutcomeInfo:
					return []interface{}{s, regState{V: s.V + 1}}
				default:
					return []interface{}{s}
				}
			}
			rejected := in.Fence < s.F || (in.Fence == s.F && s.F != 0 && in.Owner != s.O)
			claimed := regState{V: s.V, F: in.Fence, O: in.Owner}
			switch out.Read {
			case OutcomeStale:
				if rejected {
					return []interface{}{s}
				}
				return nil
			case OutcomeInfo:
				if rejected {
					return []interface{}{s}
				}
				return []interface{}{s, claimed}
			}
			if rejected || out.Value != s.V {
				return nil
			}
			inc := claimed
			inc.V++
			switch out.Write {
			case OutcomeOK:
				return []interface{}{inc}
			case OutcomeInfo:
				return []interface{}{claimed, inc}
			default: // rejected, or never written
				return []interface{}{claimed}
			}
		},
		Hash: func(state interface{}) uint64 {
			s := state.(regState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%d/%d/%s", s.V, s.F, s.O)
			return h.Sum64()
		},
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(rmwInput), output.(rmwOutput)
			var b strings.Builder
			fmt.Fprintf(&b, "%s f=%d: ", in.Proc, in.Fence)
			switch out.Read {
			case OutcomeOK:
				fmt.Fprintf(&b, "read %d", out.Value)
			case OutcomeStale:
				b.WriteString("claim rejected")
			default:
				b.WriteString("read ?")
			}
			switch out.Write {
			case OutcomeOK:
				fmt.Fprintf(&b, ", wrote %d", out.Value+1)
			case OutcomeStale:
				fmt.Fprintf(&b, ", write %d rejected", out.Value+1)
			case OutcomeInfo:
				fmt.Fprintf(&b, ", write %d ?", out.Value+1)
			}
			return b.String()
		},
		DescribeState: func(state interface{}) string {
			s := state.(regState)
			if !fenced {
				return fmt.Sprint(s.V)
			}
			return fmt.Sprintf("%d (fence %d)", s.V, s.F)
		},
	}
	return nm.ToModel()
}

// registerOps turns one register's reads and writes into porcupine
// operations, and returns the client id of every worker process.
func registerOps(evs []Event, name string) ([]porcupine.Operation, map[string]int) {
	byProc := map[string][]Event{}
	var procs []string
	for _, e := range evs {
		if !isWorkerProc(e.Proc) {
			continue
		}
		if _, ok := byProc[e.Proc]; !ok {
			procs = append(procs, e.Proc)
		}
		byProc[e.Proc] = append(byProc[e.Proc], e)
	}
	slices.SortFunc(procs, compareProcs)
	ids := map[string]int{}
	for i, p := range procs {
		ids[p] = i
	}
	var ops []porcupine.Operation
	for _, p := range procs {
		list := byProc[p]
		sort.SliceStable(list, func(i, j int) bool { return list[i].Seq < list[j].Seq })
		for i, r := range list {
			if r.Op != OpRead || r.Key != name {
				continue
			}
			op := porcupine.Operation{
				ClientId: ids[p],
				Input:    rmwInput{Proc: p, Fence: r.Fence, Owner: r.Owner},
				Call:     r.InvokeNs,
				Return:   r.CompleteNs,
			}
			out := rmwOutput{Read: r.Outcome, Value: r.Value}
			if r.Outcome != OutcomeOK && r.Outcome != OutcomeStale {
				out.Read = OutcomeInfo
			}
			if out.Read == OutcomeOK {
				for _, w := range list[i+1:] {
					if w.Op == OpAcquire {
						break
					}
					if w.Op == OpWrite && w.Key == name && w.Owner == r.Owner {
						out.Write = w.Outcome
						if w.Outcome != OutcomeOK && w.Outcome != OutcomeStale {
							out.Write = OutcomeInfo
						}
						op.Return = w.CompleteNs
						break
					}
				}
			}
			op.Output = out
			ops = append(ops, op)
		}
	}
	return ops, ids
}

func isWorkerProc(p string) bool { return strings.HasPrefix(p, "w") }

// compareProcs orders "w2.0" before "w10.0".
func compareProcs(a, b string) int {
	var aw, ai, bw, bi int
	fmt.Sscanf(a, "w%d.%d", &aw, &ai)
	fmt.Sscanf(b, "w%d.%d", &bw, &bi)
	if aw != bw {
		return aw - bw
	}
	if ai != bi {
		return ai - bi
	}
	return strings.Compare(a, b)
}

// linearizability checks one register with porcupine and writes its
// timeline when asked to.
func linearizability(evs []Event, name string, rf *ResourceFindings, leases []*lease, opts CheckOptions) error {
	ops, ids := registerOps(evs, name)
	if len(ops) == 0 {
		return nil
	}
	timeout := opts.LinearizabilityTimeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	model := registerModel(name == ResourceFenced)
	res, info := porcupine.CheckOperationsVerbose(model, ops, timeout)
	rf.Linearizable = string(res)
	if opts.VisualizeDir == "" {
		return nil
	}
	var notes []porcupine.Annotation
	for _, e := range evs {
		if !slices.Contains(faultNames, e.Op) || e.Outcome != OutcomeOK {
			continue
		}
		target := e.Target
		if e.Owner != "" {
			target += " (holding fence " + fmt.Sprint(leaseFence(leases, e.Owner)) + ")"
		}
		notes = append(notes, porcupine.Annotation{
			Tag:             "faults",
			Start:           e.InvokeNs,
			End:             e.CompleteNs,
			Description:     e.Op + " " + e.Target,
			Details:         strings.TrimSpace(e.Op + " " + target + " " + e.Detail),
			BackgroundColor: "#ffc9c9",
		})
	}
	for _, l := range leases {
		id, ok := ids[l.Proc]
		if !ok {
			continue
		}
		end := l.csEnd
		if end == math.MaxInt64 || end < l.GrantedNs {
			end = l.GrantedNs
		}
		notes = append(notes, porcupine.Annotation{
			Tag:             "leases",
			Start:           l.GrantedNs,
			End:             end,
			Description:     fmt.Sprintf("%s f=%d", l.Proc, l.Fence),
			Details:         fmt.Sprintf("lease of %s, fence %d, owner %s, certainly live for %v", l.Proc, l.Fence, l.Owner, time.Duration(l.LiveNs-l.GrantedNs).Round(time.Millisecond)),
			BackgroundColor: leaseColor(id),
		})
	}
	info.AddAnnotations(notes)
	if err := os.MkdirAll(opts.VisualizeDir, 0o755); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	path := filepath.Join(opts.VisualizeDir, name+".html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return fmt.Errorf("verify: write %s: %w", path, err)
	}
	rf.Visualization = path
	return nil
}

var palette = []string{"#d0ebff", "#d3f9d8", "#fff3bf", "#e5dbff", "#ffe8cc", "#c5f6fa", "#ffdeeb", "#e9ecef"}

func leaseColor(id int) string { return palette[id%len(palette)] }
