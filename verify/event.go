package verify

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Event is one line of a history: an operation of a worker, an
// observation of its lock client, a fault window of the injector, or a
// note of the coordinator. Times are CLOCK_MONOTONIC nanoseconds, one
// clock for every process on the machine.
//
// Fault windows use Value for a duration in nanoseconds: proxy delay: the
// delay per chunk; proxy blackhole, restart, restart-persist, server-pause:
// how long, from InvokeNs, the node certainly was unreachable (the rest of
// the window is the restart or the heal).
//
// Worker operations are written twice: a line with Outcome "invoke" when
// they start and one with the result when they end, with the same Seq.
// ReadHistory pairs them; an operation whose process died before it ended
// gets Outcome "info" and CompleteNs the death of the process.
type Event struct {
	Proc       string `json:"proc"`                // "w3.1": worker 3, incarnation 1; "nemesis"; "coordinator"
	Seq        int64  `json:"seq,omitempty"`       // per process, pairs invoke and result lines
	Op         string `json:"op"`                  // see the Op constants
	Key        string `json:"key,omitempty"`       // the lock key, or the resource ("fenced", "naive")
	InvokeNs   int64  `json:"invokeNs"`            // when the operation started
	CompleteNs int64  `json:"completeNs"`          // when it ended (= InvokeNs for instantaneous events)
	Outcome    string `json:"outcome"`             // see the Outcome constants
	Fence      uint64 `json:"fence,omitempty"`     // the lease's fence
	Owner      string `json:"owner,omitempty"`     // the lease's owner token
	Err        string `json:"err,omitempty"`       // the error, when there was one
	Value      int64  `json:"value,omitempty"`     // read: the value read; write: the value written; final: the register; acquire of a permit: the permits; fault: see below
	Count      int64  `json:"count,omitempty"`     // final: increments in the log; proxy reset: connections reset
	ExpiresNs  int64  `json:"expiresNs,omitempty"` // acquire, renew: the lease's conservative expiry (dlock.Lease.Expires)
	Phase      string `json:"phase,omitempty"`     // "quiet" for the final acquisition of each worker
	Worker     int    `json:"worker,omitempty"`    // spawn, exit: the worker number
	PID        int    `json:"pid,omitempty"`       // spawn: the process id
	Target     string `json:"target,omitempty"`    // fault: the process or server hit
	Detail     string `json:"detail,omitempty"`    // fault: mode and parameters
	Nodes      int    `json:"nodes,omitempty"`     // server and proxy faults: lock server nodes in the cluster
	Effective  *bool  `json:"effective,omitempty"` // set by Check on fault events it judged
	Hold       string `json:"hold,omitempty"`      // acquire of a kind other than the lock: HoldPermit, HoldRead, HoldWrite, HoldLeader
}

// Operations (Event.Op).
const (
	OpAcquire = "acquire" // worker: Client.Acquire
	OpRenew   = "renew"   // worker: a watchdog renewal (dlock.EventRenewed), instantaneous
	OpLost    = "lost"    // worker: the lease was lost (dlock.EventLost), instantaneous
	OpRelease = "release" // worker: Lease.Release
	OpRead    = "read"    // worker: read of a register (the fenced one claims the fence)
	OpWrite   = "write"   // worker: write of a register
	OpFinal   = "final"   // coordinator: a register's final value and its increment log length
	OpSpawn   = "spawn"   // coordinator: a worker process started
	OpExit    = "exit"    // coordinator: a worker process ended (CompleteNs: when it was reaped)
	OpChaos   = "chaos"   // coordinator: the fault phase [InvokeNs, CompleteNs]
	// Fault windows carry the fault's name (FaultPause, FaultKill, ...) as Op.
)

// Outcomes (Event.Outcome).
const (
	OutcomeInvoke = "invoke" // the operation started
	OutcomeOK     = "ok"     // it happened
	OutcomeFail   = "fail"   // it certainly did not happen (a fault: it was not injected)
	OutcomeInfo   = "info"   // unknown whether it happened
	OutcomeStale  = "stale"  // the fenced register rejected it: its fence was superseded
)

// historyWriter appends events to one file, one line per event, each
// written with one write(2) so that a process killed with SIGKILL never
// leaves a torn line behind.
type historyWriter struct {
	proc string
	mu   sync.Mutex
	f    *os.File
	seq  int64
	err  error
}

func createHistory(path, proc string) (*historyWriter, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("verify: history: %w", err)
	}
	return &historyWriter{proc: proc, f: f}, nil
}

// nextSeq returns a new operation number.
func (h *historyWriter) nextSeq() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	return h.seq
}

// log writes e, stamped with the writer's process name.
func (h *historyWriter) log(e Event) {
	e.Proc = h.proc
	b, err := json.Marshal(e)
	if err != nil {
		panic("verify: marshal event: " + err.Error()) // plain data: cannot happen
	}
	b = append(b, '\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := h.f.Write(b); err != nil && h.err == nil {
		h.err = err
	}
}

func (h *historyWriter) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.f.Close()
	if h.err != nil {
		return fmt.Errorf("verify: history: %w", h.err)
	}
	return err
}

// ReadHistory reads every *.jsonl file in dir and returns the events,
// invoke and result lines of worker operations paired into one Event
// each, sorted by InvokeNs. An operation without a result line gets
// Outcome "info" and, as CompleteNs, the time the coordinator reaped its
// process (OpExit), or math.MaxInt64 if that is unknown.
func ReadHistory(dir string) ([]Event, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("verify: no history files (*.jsonl) in %s", dir)
	}
	var all []Event
	for _, name := range files {
		evs, err := readHistoryFile(name)
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
	}
	return PairEvents(all), nil
}

func readHistoryFile(name string) ([]Event, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	line := 0
	for sc.Scan() {
		line++
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("verify: %s:%d: %w", name, line, err)
		}
		evs = append(evs, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("verify: %s: %w", name, err)
	}
	return evs, nil
}

// PairEvents merges the invoke and result lines of each operation
// (same Proc and Seq) into one Event, completes operations that never
// ended as ReadHistory describes, and sorts the result by InvokeNs (then
// Proc and Seq). Events without a Seq are kept as they are.
func PairEvents(evs []Event) []Event {
	type key struct {
		proc string
		seq  int64
	}
	exits := map[string]int64{}
	for _, e := range evs {
		if e.Op == OpExit {
			exits[e.Target] = e.CompleteNs
		}
	}
	pending := map[key]int{}
	var out []Event
	for _, e := range evs {
		if e.Seq == 0 {
			out = append(out, e)
			continue
		}
		k := key{e.Proc, e.Seq}
		if e.Outcome == OutcomeInvoke {
			pending[k] = len(out)
			out = append(out, e)
			continue
		}
		if i, ok := pending[k]; ok {
			e.InvokeNs = out[i].InvokeNs
			out[i] = e
			delete(pending, k)
			continue
		}
		out = append(out, e)
	}
	for k, i := range pending {
		out[i].Outcome = OutcomeInfo
		if t, ok := exits[k.proc]; ok && t >= out[i].InvokeNs {
			out[i].CompleteNs = t
		} else {
			out[i].CompleteNs = math.MaxInt64
		}
		if out[i].Err == "" {
			out[i].Err = "no result: the process ended first"
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.InvokeNs != b.InvokeNs {
			return a.InvokeNs < b.InvokeNs
		}
		if a.Proc != b.Proc {
			return a.Proc < b.Proc
		}
		return a.Seq < b.Seq
	})
	return out
}
