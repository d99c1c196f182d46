package verify

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// probeTimeout bounds the coordinator's first acquisition on the backend.
const probeTimeout = 10 * time.Second

// readyTimeout bounds the start of a worker process.
const readyTimeout = 30 * time.Second

// Run verifies a backend: for every experiment of cfg.Faults it runs
// cfg.Runs runs, each with fresh servers (when the URL is local), a fresh
// resource redis-server and cfg.Workers worker processes, injects the
// faults for cfg.Duration, then runs the quiet phase, checks the history
// and writes the run's files under cfg.OutDir.
//
// Run returns an error for an invalid Config (matching ErrInvalidConfig),
// a backend that does not answer (matching ErrUnavailable), a server or
// worker that cannot be started, or ctx ending; the Report then holds the
// runs completed before. Violations found by a run are not errors: they
// are in the Report (see Report.OK).
func Run(ctx context.Context, cfg Config, open OpenFunc) (*Report, error) {
	if ctx == nil {
		return nil, invalid("nil context")
	}
	if open == nil {
		return nil, invalid("nil OpenFunc")
	}
	v, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	if v.OutDir == "" {
		if v.OutDir, err = os.MkdirTemp("", "dlock-verify-"); err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
	} else if err := os.MkdirAll(v.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	rep := &Report{OutDir: v.OutDir}
	for _, exp := range v.exps {
		for i := range v.Runs {
			seed := v.Seed + int64(i)
			r, err := runOnce(ctx, v, exp, seed, open)
			if err != nil {
				return rep, err
			}
			rep.Runs = append(rep.Runs, r)
			v.progress("%s / %s seed %d: %s, %d grants (%s)", r.Label(), exp.name, seed, r.Verdict(), r.Findings.Grants, r.Dir)
		}
	}
	md := "# dlock verify\n\n"
	if v.FIFO {
		md += "Workers acquire with dlock.WithFIFO() (the server-side queue): rows marked (FIFO).\n\n"
	}
	md += rep.Markdown()
	if err := os.WriteFile(filepath.Join(v.OutDir, "report.md"), []byte(md), 0o644); err != nil {
		return rep, fmt.Errorf("verify: %w", err)
	}
	return rep, nil
}

func (v validated) progress(format string, args ...any) {
	if v.Progress != nil {
		v.Progress(fmt.Sprintf(format, args...))
	}
}

// run is the state of one run.
type run struct {
	cfg  validated
	exp  experiment
	seed int64
	open OpenFunc

	dir, histDir, logDir string
	key, prefix          string
	workerURL            string
	servers              *lockServers // nil for an external backend
	proxies              []*proxy     // nil without the proxy fault
	coord, nemesis       *historyWriter

	mu       sync.Mutex
	procs    map[int]*wproc // the current process of each worker
	inc      map[int]int    // the last incarnation of each worker
	quiet    bool           // new processes start in the quiet phase
	stopping bool           // crashed workers are not restarted
	closing  bool           // the run is over: every process is killed
	changed  chan struct{}  // poked when a worker reports progress
	reapers  sync.WaitGroup
}

// wproc is one worker process.
type wproc struct {
	worker int
	name   string
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	errLog string

	ready     chan struct{}
	readyOnce sync.Once
	exited    chan struct{}

	// guarded by run.mu
	phase  string // "", "acq", "read", "wrote": progress of its critical section
	owner  string
	fence  uint64
	done   bool // finished its quiet phase
	killed bool // killed on purpose
}

func runOnce(ctx context.Context, cfg validated, exp experiment, seed int64, open OpenFunc) (res *RunResult, err error) {
	began := time.Now()
	r := &run{
		cfg:     cfg,
		exp:     exp,
		seed:    seed,
		open:    open,
		procs:   map[int]*wproc{},
		inc:     map[int]int{},
		changed: make(chan struct{}, 1),
	}
	if err := r.makeDirs(); err != nil {
		return nil, err
	}
	id := strconv.FormatInt(seed, 10) + "-" + rand.Text()[:8]
	r.key = "verify-" + id
	r.prefix = "verify:" + id + ":"
	if r.coord, err = createHistory(filepath.Join(r.histDir, "coordinator.jsonl"), "coordinator"); err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, r.coord.close()) }()
	if r.nemesis, err = createHistory(filepath.Join(r.histDir, "nemesis.jsonl"), "nemesis"); err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, r.nemesis.close()) }()

	// Servers: the lock server(s) when local, the resource always.
	r.workerURL = cfg.BackendURL
	if cfg.url.local {
		persist := exp.has(FaultRestartPersist)
		if r.servers, err = startServers(cfg.url, persist, cfg.TTL); err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, r.servers.stop()) }()
		r.workerURL = r.servers.url
	}
	resSrv, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		return nil, fmt.Errorf("verify: start the resource redis-server: %w", err)
	}
	defer func() { err = errors.Join(err, resSrv.Stop()) }()
	if exp.has(FaultProxy) {
		defer func() {
			for _, p := range r.proxies {
				err = errors.Join(err, p.Close())
			}
		}()
		if err := r.startProxies(); err != nil {
			return nil, err
		}
	}
	if err := probe(ctx, open, r.workerURL, r.key, cfg.TTL, cfg.FIFO); err != nil {
		return nil, err
	}

	if cfg.InProcess {
		err = r.runInProcess(ctx, resSrv.Addr())
	} else {
		err = r.runProcesses(ctx, resSrv.Addr())
	}
	if err != nil {
		return nil, err
	}
	if err := r.finalValues(ctx, resSrv.Addr()); err != nil {
		return nil, err
	}

	evs, err := ReadHistory(r.histDir)
	if err != nil {
		return nil, err
	}
	f, err := Check(evs, CheckOptions{TTL: cfg.TTL, Faults: exp.kinds, VisualizeDir: r.dir})
	if err != nil {
		return nil, err
	}
	res = &RunResult{Backend: cfg.Name, Fault: exp.name, FIFO: cfg.FIFO, Seed: seed, Duration: cfg.Duration, TTL: cfg.TTL, Dir: r.dir, Findings: f}
	res.Elapsed = time.Since(began)
	b, _ := json.MarshalIndent(res, "", "  ")
	if err := os.WriteFile(filepath.Join(r.dir, SummaryFile), b, 0o644); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	return res, nil
}

// makeDirs creates the run's directories, emptied.
func (r *run) makeDirs() error {
	r.dir = filepath.Join(r.cfg.OutDir, r.cfg.Name, r.exp.name, "seed-"+strconv.FormatInt(r.seed, 10))
	r.histDir = filepath.Join(r.dir, "history")
	r.logDir = filepath.Join(r.dir, "logs")
	if err := os.RemoveAll(r.dir); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	for _, d := range []string{r.histDir, r.logDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("verify: %w", err)
		}
	}
	return nil
}

// startProxies puts a TCP proxy in front of every lock server node and
// points the workers at them.
func (r *run) startProxies() error {
	var ups []string
	if r.servers != nil {
		ups = r.servers.addrs
	} else {
		var err error
		if ups, err = upstreams(r.cfg.BackendURL, r.cfg.url.scheme); err != nil {
			return err
		}
	}
	var addrs []string
	for _, up := range ups {
		p, err := newProxy(up)
		if err != nil {
			return fmt.Errorf("verify: proxy: %w", err)
		}
		r.proxies = append(r.proxies, p)
		addrs = append(addrs, p.Addr())
	}
	r.workerURL = withHosts(r.workerURL, addrs)
	return nil
}

// probe opens the backend and takes and releases a lock once, with
// dlock.WithFIFO() when fifo is set: a backend without a server-side queue
// refuses it, an ErrInvalidConfig error.
func probe(ctx context.Context, open OpenFunc, url, key string, ttl time.Duration, fifo bool) error {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	b, closeB, err := open(pctx, url, ttl)
	if err != nil {
		return fmt.Errorf("verify: open backend %s: %w", RedactURL(url), err)
	}
	c := dlock.New(b, dlock.WithTTL(ttl))
	var opts []dlock.Option
	if fifo {
		opts = append(opts, dlock.WithFIFO())
	}
	l, err := c.TryAcquire(pctx, key+"-probe", opts...)
	if fifo && errors.Is(err, dlock.ErrInvalidOption) {
		_ = ignoreClosed(c.Close())
		if closeB != nil {
			_ = closeB()
		}
		return invalid("FIFO: the backend of %s cannot queue waiters: %v", RedactURL(url), err)
	}
	if err == nil {
		err = l.Release(pctx)
	}
	err = errors.Join(err, ignoreClosed(c.Close()))
	if closeB != nil {
		_ = closeB()
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, RedactURL(url), err)
	}
	return nil
}

func (r *run) spec(worker, inc int, resAddr string, quiet bool) workerSpec {
	name := fmt.Sprintf("w%d.%d", worker, inc)
	return workerSpec{
		Worker:   worker,
		Proc:     name,
		Backend:  r.workerURL,
		Resource: resAddr,
		Prefix:   r.prefix,
		Key:      r.key,
		Mode:     r.cfg.ResourceMode,
		TTL:      r.cfg.TTL,
		Seed:     uint64(r.seed)<<16 ^ uint64(inc),
		History:  filepath.Join(r.histDir, name+".jsonl"),
		Quiet:    quiet,
		FIFO:     r.cfg.FIFO,
		Kind:     r.cfg.Kind,
	}
}

// runInProcess runs the workers as goroutines sharing one Client.
func (r *run) runInProcess(ctx context.Context, resAddr string) (err error) {
	b, closeB, err := r.open(ctx, r.workerURL, r.cfg.TTL)
	if err != nil {
		return fmt.Errorf("verify: open backend %s: %w", RedactURL(r.workerURL), err)
	}
	client := dlock.New(b, dlock.WithTTL(r.cfg.TTL))
	defer func() {
		err = errors.Join(err, ignoreClosed(client.Close()))
		if closeB != nil {
			err = errors.Join(err, closeB())
		}
	}()
	quiet := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, r.cfg.Workers)
	start := monoNow()
	for i := range r.cfg.Workers {
		spec := r.spec(i+1, 0, resAddr, false)
		now := monoNow()
		r.coord.log(Event{Op: OpSpawn, Target: spec.Proc, Worker: spec.Worker, InvokeNs: now, CompleteNs: now, Outcome: OutcomeOK})
		wg.Go(func() {
			errs[i] = runWorker(ctx, spec, nil, client, func(string) {}, quiet)
			now := monoNow()
			e := Event{Op: OpExit, Target: spec.Proc, Worker: spec.Worker, InvokeNs: now, CompleteNs: now, Outcome: OutcomeOK}
			if errs[i] != nil {
				e.Outcome, e.Err = OutcomeFail, errs[i].Error()
			}
			r.coord.log(e)
		})
	}
	sleep(ctx, r.cfg.Duration)
	r.coord.log(Event{Op: OpChaos, InvokeNs: start, CompleteNs: monoNow(), Outcome: OutcomeOK})
	close(quiet)
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(errs...)
}

// runProcesses runs the workers as processes, with the fault injector.
func (r *run) runProcesses(ctx context.Context, resAddr string) (err error) {
	defer func() {
		// Whatever happened, no worker outlives the run.
		r.mu.Lock()
		r.stopping, r.closing = true, true
		for _, p := range r.procs {
			p.killed = true
			_ = killProcess(p.pid)
		}
		r.mu.Unlock()
		r.reapers.Wait()
	}()
	for w := 1; w <= r.cfg.Workers; w++ {
		if _, err := r.spawn(ctx, w, resAddr); err != nil {
			return err
		}
	}
	r.cfg.progress("%s / %s seed %d: %d workers up, faults for %v", label(r.cfg.Name, r.cfg.FIFO), r.exp.name, r.seed, r.cfg.Workers, r.cfg.Duration)

	start := monoNow()
	chaos, cancel := context.WithTimeout(ctx, r.cfg.Duration)
	err = r.nemesisLoop(ctx, chaos, resAddr)
	cancel()
	r.coord.log(Event{Op: OpChaos, InvokeNs: start, CompleteNs: monoNow(), Outcome: OutcomeOK})
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return r.quietPhase(ctx, resAddr)
}

// spawn starts a new incarnation of worker w and waits until it is ready.
func (r *run) spawn(ctx context.Context, w int, resAddr string) (*wproc, error) {
	r.mu.Lock()
	inc := r.inc[w]
	if _, ok := r.procs[w]; ok {
		inc++
	}
	r.inc[w] = inc
	quiet := r.quiet
	r.mu.Unlock()

	spec := r.spec(w, inc, resAddr, quiet)
	arg, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	cmd := exec.Command(r.cfg.Exe[0], append(r.cfg.Exe[1:len(r.cfg.Exe):len(r.cfg.Exe)], string(arg))...)
	cmd.Env = append(os.Environ(), WorkerEnv+"=1")
	setWorkerAttrs(cmd)
	errLog := filepath.Join(r.logDir, spec.Proc+".stderr")
	ef, err := os.Create(errLog)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	defer ef.Close()
	cmd.Stderr = ef
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("verify: start worker %s: %w", spec.Proc, err)
	}
	p := &wproc{
		worker: w,
		name:   spec.Proc,
		cmd:    cmd,
		pid:    cmd.Process.Pid,
		stdin:  stdin,
		errLog: errLog,
		ready:  make(chan struct{}),
		exited: make(chan struct{}),
	}
	now := monoNow()
	r.coord.log(Event{Op: OpSpawn, Target: p.name, Worker: w, PID: p.pid, InvokeNs: now, CompleteNs: now, Outcome: OutcomeOK})
	r.mu.Lock()
	r.procs[w] = p
	if r.closing {
		p.killed = true
		_ = killProcess(p.pid)
	}
	r.mu.Unlock()
	r.reapers.Add(1)
	go r.reap(p, stdout, resAddr)

	t := time.NewTimer(readyTimeout)
	defer t.Stop()
	select {
	case <-p.ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("verify: worker %s exited at start: %s", p.name, tail(errLog))
	case <-t.C:
		return nil, fmt.Errorf("verify: worker %s not ready after %v: %s", p.name, readyTimeout, tail(errLog))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// tail returns the end of a worker's stderr log, for messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	if s == "" {
		return "(no output on stderr)"
	}
	return s
}

// reap follows a worker's progress reports until it exits, records the
// exit and restarts a worker that died unexpectedly during the fault phase.
func (r *run) reap(p *wproc, stdout io.Reader, resAddr string) {
	defer r.reapers.Done()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		r.onLine(p, sc.Text())
	}
	werr := p.cmd.Wait()
	now := monoNow()
	r.mu.Lock()
	expected := p.killed || (p.done && werr == nil)
	restart := !expected && !r.stopping
	r.mu.Unlock()
	e := Event{Op: OpExit, Target: p.name, Worker: p.worker, InvokeNs: now, CompleteNs: now, Outcome: OutcomeOK}
	if werr != nil {
		e.Err = werr.Error()
	}
	if !expected {
		e.Outcome = OutcomeFail
		e.Err = fmt.Sprintf("%v: %s", werr, tail(p.errLog))
	}
	r.coord.log(e)
	close(p.exited)
	r.poke()
	if restart {
		_, _ = r.spawn(context.Background(), p.worker, resAddr)
	}
}

func (r *run) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// onLine applies a worker's progress report.
func (r *run) onLine(p *wproc, line string) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	r.mu.Lock()
	switch f[0] {
	case "ready":
		p.readyOnce.Do(func() { close(p.ready) })
	case "acq":
		if len(f) == 3 {
			p.fence, _ = strconv.ParseUint(f[1], 10, 64)
			p.owner = f[2]
			p.phase = "acq"
		}
	case "read", "wrote":
		p.phase = f[0]
	case "rel":
		p.phase, p.owner, p.fence = "", "", 0
	case "done":
		p.done = true
	}
	r.mu.Unlock()
	r.poke()
}

// quietPhase heals everything, makes sure every worker runs, asks each to
// acquire once more and waits for all of them to finish.
func (r *run) quietPhase(ctx context.Context, resAddr string) error {
	for _, p := range r.proxies {
		p.heal()
	}
	r.mu.Lock()
	r.quiet = true
	var dead []int
	for w := 1; w <= r.cfg.Workers; w++ {
		select {
		case <-r.procs[w].exited:
			dead = append(dead, w)
		default:
		}
	}
	r.mu.Unlock()
	for _, w := range dead {
		if _, err := r.spawn(ctx, w, resAddr); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.stopping = true
	procs := make([]*wproc, 0, len(r.procs))
	for _, p := range r.procs {
		procs = append(procs, p)
	}
	r.mu.Unlock()
	r.cfg.progress("%s / %s seed %d: quiet phase", label(r.cfg.Name, r.cfg.FIFO), r.exp.name, r.seed)
	for _, p := range procs {
		_, _ = io.WriteString(p.stdin, "quiet\n")
	}
	deadline := time.NewTimer(quietTimeout(r.cfg.TTL) + 10*time.Second)
	defer deadline.Stop()
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-deadline.C:
			// Stragglers are killed; Check reports them (no quiet grant).
			r.mu.Lock()
			for _, q := range procs {
				q.killed = true
				_ = killProcess(q.pid)
			}
			r.mu.Unlock()
			for _, q := range procs {
				<-q.exited
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// finalValues records the registers' final values and log lengths.
func (r *run) finalValues(ctx context.Context, resAddr string) error {
	res := newResource(resAddr, r.prefix)
	defer res.close()
	var names []string
	switch r.cfg.ResourceMode {
	case ModeFenced:
		names = []string{ResourceFenced}
	case ModeNaive:
		names = []string{ResourceNaive}
	default:
		names = []string{ResourceFenced, ResourceNaive}
	}
	for _, n := range names {
		fctx, cancel := context.WithTimeout(ctx, opTimeout)
		v, incs, err := res.final(fctx, n)
		cancel()
		if err != nil {
			return fmt.Errorf("verify: read the %s register: %w", n, err)
		}
		now := monoNow()
		r.coord.log(Event{Op: OpFinal, Key: n, InvokeNs: now, CompleteNs: now, Outcome: OutcomeOK, Value: v, Count: incs})
	}
	return nil
}
