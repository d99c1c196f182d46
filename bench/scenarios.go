package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/internal/scale"
)

// config holds the sizes and durations of a run. Every figure is a median
// over runs; the runs of the subjects of a scenario are interleaved (run 1
// of every subject, then run 2, ...) so that a noisy moment of the machine
// does not fall on one subject only.
type config struct {
	quick bool
	runs  int           // repetitions of S1, S2, S3, S6
	ttl   time.Duration // lease TTL in S1, S2, S3, S6
	poll  time.Duration // retry interval of the polling subjects

	s1Dur time.Duration

	s2Dur     time.Duration
	s2Workers int

	s3Dur     time.Duration
	s3Workers int
	s3Hold    time.Duration

	s4TTL  time.Duration
	s4Reps int

	s5Leases  int
	s5Hold    time.Duration
	s5TTL     time.Duration
	s5FillMax time.Duration // the fill phase stops here, with what it got

	s6Dur  time.Duration
	s6Down int
}

func fullConfig() config {
	return config{
		runs: 5, ttl: 10 * time.Second, poll: 2 * time.Millisecond,
		s1Dur: 2 * time.Second,
		s2Dur: 2 * time.Second, s2Workers: 32,
		s3Dur: 3 * time.Second, s3Workers: 16, s3Hold: 100 * time.Microsecond,
		s4TTL: 2 * time.Second, s4Reps: 5,
		s5Leases: 100_000, s5Hold: 60 * time.Second, s5TTL: 10 * time.Second, s5FillMax: 3 * time.Minute,
		s6Dur: 2 * time.Second, s6Down: 2,
	}
}

func quickConfig() config {
	c := fullConfig()
	c.quick = true
	c.runs = 1
	c.s1Dur, c.s2Dur, c.s3Dur, c.s6Dur = 300*time.Millisecond, 300*time.Millisecond, time.Second, 300*time.Millisecond
	c.s4Reps = 1
	c.s3Dur = 700 * time.Millisecond
	// A shorter TTL so that the short hold still sees renewals.
	c.s5Leases, c.s5TTL, c.s5Hold, c.s5FillMax = 500, 2*time.Second, 2*time.Second, 10*time.Second
	return c
}

// metrics are one run's figures by name.
type metrics map[string]float64

// opTimeout bounds one lock operation that should never take long (an
// uncontended acquire, a release); -quick lowers it.
var opTimeout = 30 * time.Second

// opCtx returns a context bounded by opTimeout.
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// cycle takes and releases key once.
func cycle(l locker, key string) error {
	ctx, cancel := opCtx()
	defer cancel()
	h, err := l.lock(ctx, key)
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if err := h.unlock(ctx); err != nil {
		return fmt.Errorf("unlock: %w", err)
	}
	return nil
}

// countStart zeroes the client counter and the servers' statistics after
// the warm-up.
func countStart(e *env, s *subject, c *counter) error {
	c.requests.Store(0)
	c.commands.Store(0)
	for _, a := range e.redisAddrs(s.server) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := resetStats(ctx, a)
		cancel()
		if err != nil && s.server != srvRedis5 {
			return err
		}
	}
	return nil
}

// perOp adds the request figures of n operations to m.
func perOp(e *env, s *subject, c *counter, n int64, m metrics) error {
	if n == 0 {
		return nil
	}
	if s.server != srvMem {
		m["req/op"] = float64(c.requests.Load()) / float64(n)
	}
	cmds, ok, err := e.serverCommands(s.server)
	if err != nil {
		return err
	}
	if ok {
		m["srv/op"] = float64(cmds) / float64(n)
	}
	return nil
}

// ---- S1: uncontended ----

// measureS1: one goroutine takes and releases one key in a loop.
func measureS1(e *env, c config, s *subject, run int) (metrics, error) {
	return measureSerial(e, c, s, run, "s1", c.s1Dur)
}

func measureSerial(e *env, c config, s *subject, run int, name string, dur time.Duration) (metrics, error) {
	return measureLoop(e, c, s, run, name, dur, s.open)
}

// measureLoop is measureSerial on the lockers open returns (K1: a
// semaphore's permits).
func measureLoop(e *env, c config, s *subject, run int, name string, dur time.Duration, open func(*env, openOpts) (locker, error)) (metrics, error) {
	cnt := &counter{}
	l, err := open(e, openOpts{ttl: c.ttl, poll: c.poll, count: cnt})
	if err != nil {
		return nil, err
	}
	defer l.close()
	key := fmt.Sprintf("%s-%s-%d", name, s.id, run)
	warm := 20
	if s.server == srvRedis5 && c.quick {
		warm = 1 // S6: a cycle with nodes down takes up to 1 s
	}
	for range warm { // warm-up: connections, script cache
		if err := cycle(l, key); err != nil {
			return nil, err
		}
	}
	if err := countStart(e, s, cnt); err != nil {
		return nil, err
	}
	lat := make([]time.Duration, 0, 1<<16)
	acq := make([]time.Duration, 0, 1<<16)
	var errs int
	var firstErr error
	start := time.Now()
	for time.Since(start) < dur {
		ctx, cancel := opCtx()
		t := time.Now()
		h, err := l.lock(ctx, key)
		if err != nil {
			cancel()
			errs++
			firstErr = cmp(firstErr, err)
			continue
		}
		a := time.Since(t)
		err = h.unlock(ctx)
		cancel()
		if err != nil {
			errs++
			firstErr = cmp(firstErr, err)
			continue
		}
		lat = append(lat, time.Since(t))
		acq = append(acq, a)
	}
	elapsed := time.Since(start)
	n := int64(len(lat))
	if n == 0 {
		return nil, fmt.Errorf("no successful cycle: %w", firstErr)
	}
	m := metrics{
		"ops/s":   float64(n) / elapsed.Seconds(),
		"p50":     micros(percentile(lat, 50)),
		"p99":     micros(percentile(lat, 99)),
		"acq p50": micros(percentile(acq, 50)),
		"acq p99": micros(percentile(acq, 99)),
		"errors":  float64(errs),
	}
	return m, perOp(e, s, cnt, n, m)
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// ---- S2: parallel ----

// measureS2: c.s2Workers goroutines share one client, each on its own key.
func measureS2(e *env, c config, s *subject, run int) (metrics, error) {
	cnt := &counter{}
	l, err := s.open(e, openOpts{ttl: c.ttl, poll: c.poll, count: cnt})
	if err != nil {
		return nil, err
	}
	defer l.close()
	keys := make([]string, c.s2Workers)
	for i := range keys {
		keys[i] = fmt.Sprintf("s2-%s-%d-%d", s.id, run, i)
	}
	var wg sync.WaitGroup
	errc := make(chan error, len(keys))
	for _, k := range keys { // warm-up, in parallel so the pool fills
		wg.Go(func() {
			for range 5 {
				if err := cycle(l, k); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return nil, err
	default:
	}
	if err := countStart(e, s, cnt); err != nil {
		return nil, err
	}
	var ops, errs atomic.Int64
	start := time.Now()
	for _, k := range keys {
		wg.Go(func() {
			for time.Since(start) < c.s2Dur {
				if err := cycle(l, k); err != nil {
					errs.Add(1)
					select {
					case errc <- err:
					default:
					}
					continue
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if ops.Load() == 0 {
		return nil, fmt.Errorf("no successful cycle: %w", <-errc)
	}
	m := metrics{"ops/s": float64(ops.Load()) / elapsed.Seconds(), "errors": float64(errs.Load())}
	return m, perOp(e, s, cnt, ops.Load(), m)
}

// ---- S3: contended ----

// measureS3: c.s3Workers goroutines, each with its own client (as separate
// processes would have), take one key in turns and hold it c.s3Hold.
func measureS3(e *env, c config, s *subject, run int) (metrics, error) {
	cnt := &counter{}
	lockers, err := openS3Lockers(e, c, s, run, cnt)
	defer func() {
		for _, l := range lockers {
			_ = l.close()
		}
	}()
	if err != nil {
		return nil, err
	}
	if err := countStart(e, s, cnt); err != nil {
		return nil, err
	}
	r := &s3Run{
		hold:  c.s3Hold,
		key:   fmt.Sprintf("s3-%s-%d", s.id, run),
		acq:   make([]int64, len(lockers)),
		waits: make([][]time.Duration, len(lockers)),
	}
	elapsed, reqs, cmds, isRedis, err := r.contend(e, c.s3Dur, s, cnt, lockers)
	if err != nil {
		return nil, err
	}
	return r.metrics(s, elapsed, reqs, cmds, isRedis)
}

// openS3Lockers opens c.s3Workers lockers of s, each warmed up with one
// cycle on a key of its own. On error it returns the lockers opened so
// far, for the caller to close.
func openS3Lockers(e *env, c config, s *subject, run int, cnt *counter) ([]locker, error) {
	lockers := make([]locker, 0, c.s3Workers)
	for range c.s3Workers {
		l, err := s.open(e, openOpts{ttl: c.ttl, poll: c.poll, count: cnt})
		if err != nil {
			return lockers, err
		}
		lockers = append(lockers, l)
	}
	for i, l := range lockers { // warm-up: connections, scripts, sessions
		if err := cycle(l, fmt.Sprintf("s3w-%s-%d-%d", s.id, run, i)); err != nil {
			return lockers, err
		}
	}
	return lockers, nil
}

// s3Run is the state the S3 workers share while they take one key in
// turns: what each acquired and waited, hand-offs, overlaps and errors.
type s3Run struct {
	hold time.Duration // time spent inside per acquisition
	key  string

	stop               atomic.Bool
	inCS               atomic.Int32
	overlaps, handoffs atomic.Int64
	last               atomic.Int64 // the worker that held the key last, -1 for none
	errs               atomic.Int64
	firstErr           atomic.Pointer[error]
	holdSum            atomic.Int64

	acq   []int64           // acquisitions per worker
	waits [][]time.Duration // waits per worker
}

// contend runs one worker per locker for dur and returns the time measured,
// the client requests and server commands counted within it, and whether
// the server counts commands (Redis).
func (r *s3Run) contend(e *env, dur time.Duration, s *subject, cnt *counter, lockers []locker) (elapsed time.Duration, reqs, cmds int64, isRedis bool, err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.last.Store(-1)
	var wg sync.WaitGroup
	startc := make(chan struct{})
	for i, l := range lockers {
		wg.Go(func() {
			<-startc
			r.work(ctx, i, l)
		})
	}
	start := time.Now()
	close(startc)
	time.Sleep(dur)
	r.stop.Store(true)
	elapsed = time.Since(start)
	reqs = cnt.requests.Load()
	cmds, isRedis, err = e.serverCommands(s.server)
	cancel()
	wg.Wait()
	return elapsed, reqs, cmds, isRedis, err
}

// work is worker i: it takes the key with l and holds it r.hold, again and
// again until the run stops.
func (r *s3Run) work(ctx context.Context, i int, l locker) {
	for !r.stop.Load() {
		t := time.Now()
		h, err := l.lock(ctx, r.key)
		if err != nil {
			if !r.stop.Load() {
				r.recordErr(err)
			}
			return
		}
		if w := time.Since(t); !r.stop.Load() {
			r.inside(i, w)
		}
		uctx, ucancel := opCtx()
		err = h.unlock(uctx)
		ucancel()
		if err != nil && !r.stop.Load() {
			r.recordErr(err)
		}
	}
}

// inside counts worker i's acquisition after waiting w, and holds the key
// r.hold.
func (r *s3Run) inside(i int, w time.Duration) {
	if r.inCS.Add(1) != 1 {
		r.overlaps.Add(1)
	}
	if prev := r.last.Swap(int64(i)); prev >= 0 && prev != int64(i) {
		r.handoffs.Add(1)
	}
	r.acq[i]++
	r.waits[i] = append(r.waits[i], w)
	hs := time.Now()
	spin(r.hold)
	r.holdSum.Add(int64(time.Since(hs)))
	r.inCS.Add(-1)
}

// recordErr counts err and keeps it if it is the first.
func (r *s3Run) recordErr(err error) {
	r.errs.Add(1)
	r.firstErr.CompareAndSwap(nil, &err)
}

// metrics returns S3's figures of the run, over elapsed; an error if no
// worker acquired.
func (r *s3Run) metrics(s *subject, elapsed time.Duration, reqs, cmds int64, isRedis bool) (metrics, error) {
	var total int64
	var all []time.Duration
	for i := range r.acq {
		total += r.acq[i]
		all = append(all, r.waits[i]...)
	}
	if total == 0 {
		if p := r.firstErr.Load(); p != nil {
			return nil, fmt.Errorf("no acquisition: %w", *p)
		}
		return nil, errors.New("no acquisition")
	}
	cycleTime := elapsed / time.Duration(total)
	m := metrics{
		"acq/s":      float64(total) / elapsed.Seconds(),
		"handoffs/s": float64(r.handoffs.Load()) / elapsed.Seconds(),
		"p50 wait":   micros(percentile(all, 50)) / 1000,
		"p99 wait":   micros(percentile(all, 99)) / 1000,
		"max wait":   micros(percentile(all, 100)) / 1000,
		"jain":       jain(r.acq),
		"overlaps":   float64(r.overlaps.Load()),
		"errors":     float64(r.errs.Load()),
		"hold":       micros(time.Duration(r.holdSum.Load() / total)),
		"ideal wait": micros(time.Duration(len(r.acq))*cycleTime) / 1000,
	}
	if s.server != srvMem {
		m["req/op"] = float64(reqs) / float64(total)
	}
	if isRedis {
		m["srv/op"] = float64(cmds) / float64(total)
	}
	return m, nil
}

// ---- S5: scale ----

// measureS5Local: one client takes c.s5Leases locks with its auto-renewal
// and keeps them c.s5Hold; it measures renewal traffic, CPU and heap. It
// runs in a child process (measureS5), so that the heap and CPU figures are
// the subject's alone and a library that crashes takes only its own
// measurement down.
func measureS5Local(e *env, c config, s *subject, run int) (metrics, error) {
	cnt := &counter{}
	prefix := fmt.Sprintf("s5-%s-%d-", s.id, run)
	r := newS5Run(s.id, prefix, c.s5Leases) // before the first heap sample
	l, err := s.open(e, openOpts{ttl: c.s5TTL, poll: c.poll, count: cnt})
	if err != nil {
		return nil, err
	}
	defer l.close()
	if err := cycle(l, prefix+"warm"); err != nil {
		return nil, err
	}
	m0 := scale.Sample()
	fill := r.fill(l, c.s5FillMax)
	n := r.taken()
	if n == 0 {
		if p := r.firstErr.Load(); p != nil {
			return nil, fmt.Errorf("no lease taken: %w", *p)
		}
		return nil, errors.New("no lease taken")
	}
	m1 := scale.Sample()
	lostAtFill, _ := lostLeases(r.hs)

	if err := countStart(e, s, cnt); err != nil {
		return nil, err
	}
	cpu0 := cpuTime()
	time.Sleep(c.s5Hold)
	cpu := cpuTime() - cpu0
	reqs := cnt.requests.Load()
	cmds, isRedis, err := e.serverCommands(s.server)
	if err != nil {
		return nil, err
	}
	lost, causes := lostLeases(r.hs)
	logLossCauses(causes)
	heap, stack := scale.PerItem(m0, m1, n)
	m := metrics{
		"leases":       float64(n),
		"fill s":       fill.Seconds(),
		"cpu s":        cpu.Seconds(),
		"heap B/l":     heap,
		"stack B/l":    max(0, stack),
		"goroutines":   float64(m1.Goroutines - m0.Goroutines),
		"lost":         float64(lost),
		"lost at fill": float64(lostAtFill),
		"fill errors":  float64(r.failed.Load()),
		"fill stalls":  float64(r.stalled.Load()),
	}
	if err := s5Traffic(e, c, s, m, n, reqs, cmds, isRedis, prefix); err != nil {
		return nil, err
	}
	r.releaseAll()
	return m, nil
}

// s5Run is one S5 fill: the keys, the leases taken on them and what failed.
type s5Run struct {
	subject string   // the subject's id, for the stack dump of a stall
	keys    []string // the keys to take, in order
	hs      []held   // hs[i] holds keys[i], nil if not taken

	next            atomic.Int64 // the next index of keys to take
	failed, stalled atomic.Int64
	firstErr        atomic.Pointer[error]
}

// newS5Run returns the run of subject on n keys that start with prefix.
func newS5Run(subject, prefix string, n int) *s5Run {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%06d", prefix, i)
	}
	return &s5Run{subject: subject, keys: keys, hs: make([]held, n)}
}

// fill takes r's keys with l, 64 at a time, until done or limit has
// passed; it returns the time it took.
func (r *s5Run) fill(l locker, limit time.Duration) time.Duration {
	fillStart := time.Now()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for time.Since(fillStart) < limit {
				i := int(r.next.Add(1) - 1)
				if i >= len(r.keys) {
					return
				}
				h, stuck, err := r.acquire(l, r.keys[i])
				if err != nil {
					r.failed.Add(1)
					r.firstErr.CompareAndSwap(nil, &err)
					if stuck {
						return // this worker's acquire is stuck
					}
					continue
				}
				r.hs[i] = h
			}
		})
	}
	wg.Wait()
	return time.Since(fillStart)
}

// acquire takes key with l. The lock's context must outlive the call
// (rueidislock releases a lock when it ends), so the call runs without a
// deadline and is abandoned if it does not return within opTimeout
// (stuck): a library that stalls ends the fill with what it took instead
// of hanging the measurement.
func (r *s5Run) acquire(l locker, key string) (h held, stuck bool, err error) {
	ctx, cancel := opCtx()
	defer cancel()
	type result struct {
		h   held
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := l.lock(context.WithoutCancel(ctx), key)
		done <- result{h, err}
	}()
	select {
	case res := <-done:
		return res.h, false, res.err
	case <-ctx.Done():
		if r.stalled.Add(1) == 1 {
			dumpStacks(r.subject)
		}
		return nil, true, fmt.Errorf("an acquire did not return within %v (stalled)", opTimeout)
	}
}

// taken returns how many of r's leases were taken.
func (r *s5Run) taken() int {
	n := 0
	for _, h := range r.hs {
		if h != nil {
			n++
		}
	}
	return n
}

// releaseAll releases every lease of r, 64 at a time.
func (r *s5Run) releaseAll() {
	scale.Each(len(r.hs), 64, func(i int) error {
		if r.hs[i] != nil {
			ctx, cancel := opCtx()
			_ = r.hs[i].unlock(ctx)
			cancel()
		}
		return nil
	})
}

// lostLeases returns how many of hs are lost, and how many per cause where
// the library says why.
func lostLeases(hs []held) (int, map[string]int) {
	lost := 0
	causes := map[string]int{}
	for _, h := range hs {
		if h != nil && h.lost() {
			lost++
			if lc, ok := h.(lossCauser); ok {
				causes[lc.lossCause()]++
			}
		}
	}
	return lost, causes
}

// logLossCauses writes the three commonest causes to the parent's log
// (measureS5 forwards these lines).
func logLossCauses(causes map[string]int) {
	order := make([]string, 0, len(causes))
	for cause := range causes {
		order = append(order, cause)
	}
	slices.SortFunc(order, func(a, b string) int { return causes[b] - causes[a] })
	for i, cause := range order[:min(3, len(order))] {
		if len(cause) > 400 {
			cause = cause[:400] + "…"
		}
		fmt.Fprintf(os.Stdout, "%slost: cause %d of %d distinct, %d lease(s): %s\n", notePrefix, i+1, len(order), causes[order[i]], cause)
	}
}

// s5Traffic adds to m the renewal traffic of the hold (reqs client
// requests, cmds server commands for n leases) and the locks of prefix
// still on the server where the subject can count them.
func s5Traffic(e *env, c config, s *subject, m metrics, n int, reqs, cmds int64, isRedis bool, prefix string) error {
	if s.server != srvMem {
		tick := c.s5TTL / 3
		rps := float64(reqs) / c.s5Hold.Seconds()
		m["rt/s"] = rps
		m["rt/1k/tick"] = rps * tick.Seconds() / (float64(n) / 1000)
	}
	if isRedis {
		m["srv/s"] = float64(cmds) / c.s5Hold.Seconds()
	}
	if s.serverKeys != nil {
		k, err := s.serverKeys(e, prefix)
		if err != nil {
			return fmt.Errorf("counting locks on the server: %w", err)
		}
		m["on server"] = float64(k)
	}
	return nil
}

// cpuTime is the process' user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ---- S6: degraded Redlock ----

// measureS6: S1's loop on five Redis nodes of which c.s6Down are stopped
// (the scenario's setup stops them).
func measureS6(e *env, c config, s *subject, run int) (metrics, error) {
	return measureSerial(e, c, s, run, "s6", c.s6Dur)
}

// stopNodes kills the last n of the five Redis nodes and returns a function
// that restarts them (empty: the servers run without persistence).
func stopNodes(e *env, n int) (restart func() error, err error) {
	rs, err := e.startRedis5()
	if err != nil {
		return nil, err
	}
	down := rs[len(rs)-n:]
	for _, r := range down {
		if err := r.Kill(); err != nil {
			return nil, err
		}
	}
	return func() error {
		var errs []error
		for _, r := range down {
			errs = append(errs, r.Restart())
		}
		return errors.Join(errs...)
	}, nil
}

// dumpStacks writes every goroutine's stack to a file in the temporary
// directory and names it on a note line, for the parent's log: why a
// library's acquire stalled.
func dumpStacks(subject string) {
	f, err := os.CreateTemp("", "dlock-bench-s5-"+subject+"-stacks-*.txt")
	if err != nil {
		return
	}
	defer f.Close()
	if err := pprof.Lookup("goroutine").WriteTo(f, 1); err != nil {
		return
	}
	fmt.Fprintf(os.Stdout, "%sfill stalled: goroutine stacks in %s\n", notePrefix, f.Name())
}
