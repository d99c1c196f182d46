package verify

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
)

// workerSpec is everything a worker needs, passed as its one argument.
type workerSpec struct {
	Worker   int           `json:"worker"`   // worker number, from 1
	Proc     string        `json:"proc"`     // process name, "w3.1"
	Backend  string        `json:"backend"`  // URL for the OpenFunc
	Resource string        `json:"resource"` // resource redis-server address
	Prefix   string        `json:"prefix"`   // resource key prefix
	Key      string        `json:"key"`      // the lock key
	Mode     string        `json:"mode"`     // ModeFenced, ModeNaive, ModeBoth
	TTL      time.Duration `json:"ttl"`
	Seed     uint64        `json:"seed"`
	History  string        `json:"history"`        // path of the history file
	Quiet    bool          `json:"quiet"`          // start in the quiet phase
	FIFO     bool          `json:"fifo"`           // acquire with dlock.WithFIFO()
	Kind     string        `json:"kind,omitempty"` // Config.Kind; "" is KindLock
}

// Timing of a worker's loop, as fractions of the TTL. The critical section
// spends TTL/10–TTL/4 between its read and its write (the window a pause
// aims for), and a worker waits up to TTL/10 between iterations so that
// the releaser does not always win the lock back.
const (
	workMinDiv  = 10
	workMaxDiv  = 4
	thinkMaxDiv = 10
)

// acquireTimeout bounds one Acquire in the fault phase, quietTimeout the
// whole quiet phase of a worker.
func acquireTimeout(ttl time.Duration) time.Duration { return max(10*ttl, 2*time.Second) }
func quietTimeout(ttl time.Duration) time.Duration   { return max(30*ttl, 15*time.Second) }

// opTimeout bounds each resource operation and each release.
const opTimeout = 5 * time.Second

// WorkerMain is the entry point of a worker process: the program calls it
// with the arguments the coordinator appended after Config.Exe (today one
// JSON document; treat them as opaque) and exits with its result. open
// must understand the backend URLs the program's coordinator uses.
//
// The worker loops — acquire the lock (auto-renewed, the configured TTL),
// read-modify-write the register(s) with its fence, release — logging
// every step to its history file, and reports its progress on standard
// output, one word per line, for the coordinator. The line "quiet" on
// standard input starts the quiet phase: it acquires once more and exits
// 0. End of standard input aborts the run. It returns 2 for bad
// arguments and 1 when the backend or the resource cannot be opened.
func WorkerMain(ctx context.Context, args []string, open OpenFunc) int {
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "verify: worker: want 1 argument (the worker spec from the coordinator), got %d\n", len(args))
		return 2
	}
	var spec workerSpec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "verify: worker: malformed spec: %v\n", err)
		return 2
	}
	if open == nil {
		fmt.Fprintln(os.Stderr, "verify: worker: nil OpenFunc")
		return 2
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	quiet := make(chan struct{})
	var quietOnce sync.Once
	startQuiet := func() { quietOnce.Do(func() { close(quiet) }) }
	if spec.Quiet {
		startQuiet()
	}
	// The coordinator's commands; end of input means it is gone.
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "quiet" {
				startQuiet()
			}
		}
		cancel()
	}()
	var outMu sync.Mutex
	notify := func(msg string) {
		outMu.Lock()
		defer outMu.Unlock()
		io.WriteString(os.Stdout, msg+"\n")
	}
	if err := runWorker(ctx, spec, open, nil, notify, quiet); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runWorker runs one worker until its quiet phase ends or ctx ends. With a
// nil shared Client it opens its own backend (a worker process); otherwise
// it uses shared (in-process workers).
func runWorker(ctx context.Context, spec workerSpec, open OpenFunc, shared *dlock.Client, notify func(string), quiet <-chan struct{}) (err error) {
	hist, err := createHistory(spec.History, spec.Proc)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, hist.close()) }()

	client := shared
	if client == nil {
		b, closeB, err := open(ctx, spec.Backend, spec.TTL)
		if err != nil {
			return fmt.Errorf("verify: worker %s: open backend %s: %w", spec.Proc, RedactURL(spec.Backend), err)
		}
		client = dlock.New(b, dlock.WithTTL(spec.TTL))
		defer func() {
			err = errors.Join(err, ignoreClosed(client.Close()))
			if closeB != nil {
				err = errors.Join(err, closeB())
			}
		}()
		if err := client.Err(); err != nil {
			return fmt.Errorf("verify: worker %s: %w", spec.Proc, err)
		}
	}
	res := newResource(spec.Resource, spec.Prefix)
	defer func() { err = errors.Join(err, res.close()) }()

	w := &worker{
		spec:   spec,
		client: client,
		res:    res,
		hist:   hist,
		rng:    rand.New(rand.NewPCG(spec.Seed, uint64(spec.Worker))),
		notify: notify,
		fenced: spec.Mode == ModeFenced || spec.Mode == ModeBoth,
		naive:  spec.Mode == ModeNaive || spec.Mode == ModeBoth,
		// The weakening travels in the backend URL (WithWeakening).
		fenceOff: fenceCheckOff(spec.Backend),
	}
	w.obs = observer{w}
	w.opts = []dlock.Option{dlock.WithObserver(w.obs)}
	if spec.FIFO {
		w.opts = append(w.opts, dlock.WithFIFO())
	}
	notify("ready")
	for {
		select {
		case <-quiet:
			w.quietPhase(ctx)
			notify("done")
			return nil
		default:
		}
		if ctx.Err() != nil {
			return nil
		}
		w.iterate(ctx, "")
	}
}

func ignoreClosed(err error) error {
	if errors.Is(err, dlock.ErrClosed) {
		return nil
	}
	return err
}

type worker struct {
	spec          workerSpec
	client        *dlock.Client
	res           *resource
	hist          *historyWriter
	rng           *rand.Rand
	notify        func(string)
	obs           observer
	opts          []dlock.Option // of every Acquire
	fenced, naive bool
	fenceOff      bool       // the fenced register's check is off (WeakenNoFenceCheck)
	kind          *kindState // the primitive of a kind other than KindLock
}

// quietPhase acquires until one acquisition succeeds or the quiet timeout
// passes.
func (w *worker) quietPhase(ctx context.Context) {
	deadline := time.Now().Add(quietTimeout(w.spec.TTL))
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if w.iterate(ctx, "quiet") {
			return
		}
	}
}

// begin logs the invocation of an operation and returns its event.
func (w *worker) begin(op, key string, f uint64, owner, phase string) Event {
	e := Event{Seq: w.hist.nextSeq(), Op: op, Key: key, InvokeNs: monoNow(), Outcome: OutcomeInvoke, Fence: f, Owner: owner, Phase: phase}
	w.hist.log(e)
	return e
}

// end logs the result of e.
func (w *worker) end(e Event, outcome string, err error) {
	e.CompleteNs = monoNow()
	e.Outcome = outcome
	if err != nil {
		e.Err = err.Error()
	}
	w.hist.log(e)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (w *worker) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)))
}

// iterate runs one acquire → read-modify-write → release cycle and
// reports whether the lock was acquired.
func (w *worker) iterate(ctx context.Context, phase string) bool {
	l, ok := w.acquire(ctx, phase)
	if !ok {
		sleep(ctx, w.between(w.spec.TTL/20, w.spec.TTL/5))
		return false
	}
	if w.kindCycle(ctx, l, phase) {
		return true
	}
	// The read-modify-write. It deliberately does not check the lease
	// before writing: a check narrows the window but cannot close it (the
	// process can stop right after the check), and the harness measures
	// what the lock and the resource guarantee without that help.
	vals := w.read(ctx, l, phase)
	w.notify("read")
	sleep(ctx, w.between(w.spec.TTL/workMinDiv, w.spec.TTL/workMaxDiv))
	w.write(ctx, l, phase, vals)
	w.notify("wrote")
	w.release(ctx, l, phase)
	w.notify("rel")
	sleep(ctx, w.between(0, w.spec.TTL/thinkMaxDiv))
	return true
}

// acquire takes the lock, logging the attempt.
func (w *worker) acquire(ctx context.Context, phase string) (*dlock.Lease, bool) {
	actx, cancel := context.WithTimeout(ctx, acquireTimeout(w.spec.TTL))
	e := w.begin(OpAcquire, w.spec.Key, 0, "", phase)
	l, hold, err := w.take(actx)
	cancel()
	e.Hold, e.Value = hold, w.permits()
	if err != nil {
		outcome := OutcomeInfo
		if errors.Is(err, dlock.ErrNotAcquired) {
			outcome = OutcomeFail
		}
		w.end(e, outcome, err)
		return nil, false
	}
	f, owner := l.Fence(), l.Owner()
	e.Fence, e.Owner, e.ExpiresNs = f, owner, monoAt(l.Expires())
	w.end(e, OutcomeOK, nil)
	w.notify("acq " + strconv.FormatUint(f, 10) + " " + owner)
	return l, true
}

// readValues are the registers' values a cycle read (ok: the read
// succeeded).
type readValues struct {
	fenced, naive     int64
	fencedOK, naiveOK bool
}

// read reads the registers under lease l.
func (w *worker) read(ctx context.Context, l *dlock.Lease, phase string) readValues {
	var v readValues
	f, owner := l.Fence(), l.Owner()
	if w.fenced {
		r := w.begin(OpRead, ResourceFenced, f, owner, phase)
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		read := w.res.fencedRead
		if w.fenceOff {
			read = w.res.uncheckedRead
		}
		x, stale, err := read(rctx, f, owner)
		cancel()
		switch {
		case err != nil:
			w.end(r, OutcomeInfo, err)
		case stale:
			w.end(r, OutcomeStale, errors.New("claim rejected: a later fence claimed the register"))
		default:
			r.Value = x
			w.end(r, OutcomeOK, nil)
			v.fenced, v.fencedOK = x, true
		}
	}
	if w.naive {
		r := w.begin(OpRead, ResourceNaive, f, owner, phase)
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		x, err := w.res.naiveRead(rctx)
		cancel()
		if err != nil {
			w.end(r, OutcomeInfo, err)
		} else {
			r.Value = x
			w.end(r, OutcomeOK, nil)
			v.naive, v.naiveOK = x, true
		}
	}
	return v
}

// write writes each register read successfully plus one.
func (w *worker) write(ctx context.Context, l *dlock.Lease, phase string, v readValues) {
	f, owner := l.Fence(), l.Owner()
	if v.naiveOK {
		wr := w.begin(OpWrite, ResourceNaive, f, owner, phase)
		wr.Value = v.naive + 1
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		err := w.res.naiveWrite(wctx, v.naive+1)
		if err != nil {
			w.end(wr, OutcomeInfo, err)
		} else {
			w.end(wr, OutcomeOK, nil)
			_ = w.res.logIncrement(wctx, ResourceNaive, fmt.Sprintf("%s:%d", w.spec.Proc, wr.Seq))
		}
		cancel()
	}
	if v.fencedOK {
		wr := w.begin(OpWrite, ResourceFenced, f, owner, phase)
		wr.Value = v.fenced + 1
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		write := w.res.fencedWrite
		if w.fenceOff {
			write = w.res.uncheckedWrite
		}
		err := write(wctx, v.fenced+1, f, owner)
		var stale *fence.StaleError
		switch {
		case errors.As(err, &stale):
			w.end(wr, OutcomeStale, err)
		case err != nil:
			w.end(wr, OutcomeInfo, err)
		default:
			w.end(wr, OutcomeOK, nil)
			_ = w.res.logIncrement(wctx, ResourceFenced, fmt.Sprintf("%s:%d", w.spec.Proc, wr.Seq))
		}
		cancel()
	}
}

// release gives the lock back, logging the outcome.
func (w *worker) release(ctx context.Context, l *dlock.Lease, phase string) {
	r := w.begin(OpRelease, w.spec.Key, l.Fence(), l.Owner(), phase)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	err := l.Release(rctx)
	cancel()
	switch {
	case err == nil:
		w.end(r, OutcomeOK, nil)
	case errors.Is(err, dlock.ErrNotHeld), errors.Is(err, dlock.ErrLost), errors.Is(err, dlock.ErrReleased):
		w.end(r, OutcomeFail, err)
	default:
		w.end(r, OutcomeInfo, err)
	}
}

// monoAt converts a time.Time with a monotonic reading (a Lease's
// Expires) to the shared clock.
func monoAt(t time.Time) int64 {
	return monoNow() + int64(time.Until(t))
}

// observer logs the watchdog's renewals and the leases' losses.
type observer struct{ w *worker }

func (o observer) Observe(ctx context.Context, e dlock.Event) context.Context {
	switch e.Kind {
	case dlock.EventRenewed, dlock.EventLost:
	default:
		return ctx
	}
	if e.Lease == nil {
		return ctx
	}
	now := monoNow()
	ev := Event{Op: OpRenew, Key: e.Key, InvokeNs: now, CompleteNs: now, Outcome: OutcomeOK, Fence: e.Lease.Fence(), Owner: e.Lease.Owner()}
	if e.Kind == dlock.EventLost {
		ev.Op = OpLost
	} else {
		ev.ExpiresNs = monoAt(e.Lease.Expires())
	}
	if e.Err != nil {
		ev.Err = e.Err.Error()
		if e.Kind == dlock.EventRenewed {
			ev.Outcome = OutcomeFail
		}
	}
	o.w.hist.log(ev)
	return ctx
}
