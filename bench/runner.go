package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// column is one figure of a scenario's table.
type column struct {
	key    string // metrics key
	head   string // table heading
	digits int    // decimals
	// ratio adds "× floor" and "× best peer" columns after this one.
	ratio bool
	// lowerBetter: for the best peer, the smallest value wins.
	lowerBetter bool
}

// scenario is one of S1–S6.
type scenario struct {
	id, title string
	about     string
	// applies returns why s is not measured here, or "".
	applies func(s *subject) string
	runs    func(c config) int
	measure func(e *env, c config, s *subject, run int) (metrics, error)
	// setup runs before the first measurement; its teardown after the last.
	setup   func(e *env, c config) (teardown func() error, err error)
	columns []column
	// extra figures aggregated as the maximum over runs: key → new key.
	maxOf map[string]string
	// quickParallel: with -quick, measure the subjects of a run at the same
	// time (S4 spends most of its time waiting for a TTL to pass).
	quickParallel bool
}

// outcome is one subject's result in one scenario.
type outcome struct {
	s    *subject
	skip string    // why it was not measured
	runs []metrics // one per successful run
	errs []string  // failed runs
	med  metrics   // medians over runs (and maxima per maxOf)
}

func (o *outcome) value(key string) float64 {
	if o == nil || o.med == nil {
		return math.NaN()
	}
	v, ok := o.med[key]
	if !ok {
		return math.NaN()
	}
	return v
}

type result struct {
	sc       *scenario
	outs     []*outcome
	duration time.Duration
}

func (r *result) find(id string) *outcome {
	if r == nil {
		return nil
	}
	for _, o := range r.outs {
		if o.s.id == id {
			return o
		}
	}
	return nil
}

// floor returns the raw floor's outcome ("× floor" divides by it), nil if
// it was not measured.
func (r *result) floor() *outcome {
	for _, o := range r.outs {
		if o.s.id == "floor" && o.med != nil {
			return o
		}
	}
	return nil
}

// bestPeer returns the peer on server srv with the best value of col.
func (r *result) bestPeer(srv server, col column) *outcome {
	var best *outcome
	for _, o := range r.outs {
		if o.s.role != rolePeer || o.s.server != srv {
			continue
		}
		v := o.value(col.key)
		if math.IsNaN(v) {
			continue
		}
		if best == nil || (col.lowerBetter && v < best.value(col.key)) || (!col.lowerBetter && v > best.value(col.key)) {
			best = o
		}
	}
	return best
}

// runScenario measures every subject of sc, interleaving the runs.
func runScenario(e *env, c config, sc *scenario, subs []*subject, logf func(string, ...any)) *result {
	start := time.Now()
	res := &result{sc: sc}
	live := res.applicable(e, subs)
	if len(live) == 0 {
		return res
	}
	if sc.setup != nil {
		teardown, err := sc.setup(e, c)
		if err != nil {
			for _, o := range live {
				o.skip = "setup failed: " + err.Error()
			}
			return res
		}
		defer func() {
			if err := teardown(); err != nil {
				logf("%s teardown: %v", sc.id, err)
			}
		}()
	}
	measureRuns(e, c, sc, live, logf)
	for _, o := range live {
		o.summarize(sc)
	}
	res.duration = time.Since(start)
	return res
}

// applicable adds an outcome to res for every subject of subs and returns
// those to measure; the others carry the reason they are skipped.
func (res *result) applicable(e *env, subs []*subject) []*outcome {
	var live []*outcome
	for _, s := range subs {
		o := &outcome{s: s}
		res.outs = append(res.outs, o)
		if why := res.sc.applies(s); why != "" {
			o.skip = why
			continue
		}
		if why := s.reason(); why != "" {
			o.skip = why
			continue
		}
		if err := e.need(s.server); err != nil {
			o.skip = "server did not start: " + err.Error()
			continue
		}
		live = append(live, o)
	}
	return live
}

// measureRuns runs sc's measurement on every outcome of live, run 1 of
// every subject, then run 2, …; in parallel in quick mode when sc allows.
func measureRuns(e *env, c config, sc *scenario, live []*outcome, logf func(string, ...any)) {
	runs := sc.runs(c)
	measure := func(o *outcome, run int) {
		m, err := sc.measure(e, c, o.s, run)
		if err != nil {
			if errors.Is(err, errUnavailable) {
				o.skip = err.Error()
				return
			}
			logf("%s %s run %d: %v", sc.id, o.s.id, run, err)
			o.errs = append(o.errs, err.Error())
			return
		}
		o.runs = append(o.runs, m)
		logf("%s %-15s run %d/%d: %s", sc.id, o.s.id, run, runs, brief(m))
	}
	for run := 1; run <= runs; run++ {
		if sc.quickParallel && c.quick {
			var wg sync.WaitGroup
			for _, o := range live {
				wg.Go(func() {
					measure(o, run)
				})
			}
			wg.Wait()
			continue
		}
		for _, o := range live {
			if err := e.reset(o.s.server); err != nil && o.s.server != srvRedis5 {
				o.errs = append(o.errs, err.Error())
				continue
			}
			measure(o, run)
		}
	}
}

// summarize sets o's medians (and the maxima sc asks for) over its runs,
// or the reason it has none.
func (o *outcome) summarize(sc *scenario) {
	if len(o.runs) == 0 {
		if o.skip == "" {
			o.skip = "every run failed: " + firstOr(o.errs, "no result")
		}
		return
	}
	o.med = metrics{}
	keys := map[string]bool{}
	for _, m := range o.runs {
		for k := range m {
			keys[k] = true
		}
	}
	for k := range keys {
		var xs []float64
		for _, m := range o.runs {
			if v, ok := m[k]; ok {
				xs = append(xs, v)
			}
		}
		o.med[k] = median(xs)
		if nk, ok := sc.maxOf[k]; ok {
			o.med[nk] = maxOf(xs)
		}
	}
}

func firstOr(xs []string, def string) string {
	if len(xs) == 0 {
		return def
	}
	return xs[0]
}

// brief formats a run's metrics for the progress log.
func brief(m metrics) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%s", k, num(m[k], 2))
	}
	return b.String()
}

// num formats v with digits decimals and thousands separators.
func num(v float64, digits int) string {
	if math.IsNaN(v) {
		return "—"
	}
	if math.IsInf(v, 0) {
		return "∞"
	}
	s := fmt.Sprintf("%.*f", digits, v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	intPart, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, r := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteRune(',')
		}
		b.WriteRune(r)
	}
	out := b.String()
	if hasFrac {
		out += "." + frac
	}
	if neg {
		out = "-" + out
	}
	return out
}

// ---- the scenarios ----

// runsN and s4Reps return how many runs a scenario makes: the configured
// runs, or S4's repetitions.
func runsN(c config) int  { return c.runs }
func s4Reps(c config) int { return c.s4Reps }

// Columns and maxima that several scenarios share.
var (
	// reqCols: client requests and server commands per operation.
	reqCols = []column{
		{key: "req/op", head: "client req/op", digits: 2, lowerBetter: true},
		{key: "srv/op", head: "server cmds/op", digits: 2, lowerBetter: true},
	}
	// cycleCols: the rate and latency of an acquire + release cycle
	// (S1, K1), then reqCols.
	cycleCols = append([]column{
		{key: "ops/s", head: "ops/s", ratio: true},
		{key: "p50", head: "p50 µs", digits: 0, lowerBetter: true},
		{key: "p99", head: "p99 µs", digits: 0, lowerBetter: true},
	}, reqCols...)
	// overlapsCol counts acquisitions that found another goroutine
	// inside; overlapsMax reports its maximum over the runs.
	overlapsCol = column{key: "overlaps max", head: "overlaps", digits: 0, lowerBetter: true}
	overlapsMax = map[string]string{"overlaps": "overlaps max"}
	// recoveryCols: the median and maximum time to recover from a killed
	// holder (S4, K3), with recoveryMax reporting the maximum.
	recoveryCols = []column{
		{key: "recovery ms", head: "median ms", digits: 0, lowerBetter: true},
		{key: "recovery max", head: "max ms", digits: 0, lowerBetter: true},
	}
	recoveryMax = map[string]string{"recovery ms": "recovery max"}
)

// allScenarios returns every scenario, S1–S6 then the K scenarios: a table of data, long but kept as one list.
func allScenarios() []*scenario {
	always := func(*subject) string { return "" }
	return append([]*scenario{
		{
			id: "S1", title: "S1 — uncontended: one goroutine, one key, acquire + release",
			about: "One goroutine takes and releases one key in a loop for %s per run, %d runs. " +
				"Latency is that of a whole acquire + release cycle. Lease TTL %s; the watchdog of " +
				"the libraries that have one is on (it does not fire within a run).",
			applies: always, runs: runsN, measure: measureS1,
			columns: cycleCols,
		},
		{
			id: "S2", title: "S2 — parallel: 32 goroutines on 32 keys, one client",
			about: "32 goroutines share one client (one process, go-redis' default pool of 10 " +
				"connections per CPU), each on its own key, for %s per run, %d runs.",
			applies: always, runs: runsN, measure: measureS2,
			// No client requests here: rueidis, gRPC and ZooKeeper multiplex
			// the 32 goroutines on one connection, so their bursts merge.
			columns: []column{
				{key: "ops/s", head: "total ops/s", ratio: true},
				{key: "srv/op", head: "server cmds/op", digits: 2, lowerBetter: true},
			},
		},
		{
			id: "S3", title: "S3 — contended: 16 clients on one key, hold ≈100 µs",
			about: "16 goroutines, each with its own client and connections (as 16 processes " +
				"would have), take one key in turns and hold it ≈100 µs (a busy wait: time.Sleep " +
				"cannot sleep less than about 1 ms here), for %s per run, %d runs. A hand-off is an " +
				"acquisition by a different goroutine than the previous holder. Wait is the time " +
				"from calling lock to holding the lock. Jain's index is over acquisitions per " +
				"goroutine (1 = equal shares, 1/16 = one goroutine takes all). Overlaps counts " +
				"acquisitions that found another goroutine inside the critical section (must be 0).",
			applies: func(s *subject) string {
				if s.server == srvRedis5 {
					return "measured on one node only (S3 compares single-server locks)"
				}
				return ""
			},
			runs: runsN, measure: measureS3,
			columns: []column{
				{key: "acq/s", head: "acq/s"},
				{key: "handoffs/s", head: "hand-offs/s", ratio: true},
				{key: "p50 wait", head: "p50 wait ms", digits: 2, lowerBetter: true},
				{key: "p99 wait", head: "p99 wait ms", digits: 1, lowerBetter: true},
				{key: "max wait", head: "max wait ms", digits: 0, lowerBetter: true},
				{key: "jain", head: "Jain", digits: 3},
				{key: "req/op", head: "client req/acq", digits: 2, lowerBetter: true},
				{key: "srv/op", head: "server cmds/acq", digits: 2, lowerBetter: true},
				overlapsCol,
			},
			maxOf: overlapsMax,
		},
		{
			id: "S4", title: "S4 — crash recovery: the holder (TTL 2 s) is SIGKILLed",
			about: "A separate holder process (this binary, re-executed) takes the lock with a " +
				"TTL of %s; a waiter in the benchmark process starts waiting; 300 ms later the holder " +
				"is SIGKILLed. The figure is the time from the kill to the waiter's acquisition; %d " +
				"repetitions. The kill comes before the first renewal (TTL/3), so a Redis lock has " +
				"about TTL − 0.3 s left; an etcd lease or a ZooKeeper session was last refreshed up " +
				"to TTL/3 before the kill. The bound to meet is TTL + 50 ms.",
			applies: func(s *subject) string {
				if s.inProcess {
					return "in-process: no other process can share its locks"
				}
				if s.wakesOnReleaseOnly {
					return "waiters wake only on a release, not on expiry: a killed holder strands them"
				}
				return ""
			},
			runs: s4Reps, measure: measureS4,
			columns: recoveryCols, maxOf: recoveryMax,
			quickParallel: true,
		},
		{
			id: "S5", title: "S5 — scale: 100,000 leases held with auto-renew",
			about: "One client takes %s leases (64 at a time; an acquire that has not returned after %s is " +
				"abandoned and its goroutine stops filling) with TTL %s and keeps them for %s " +
				"with its own renewal; then checks that none was lost (the library's own signal, " +
				"and the locks still present on the server where it can be counted). Round trips " +
				"are counted on the client's sockets during the hold; a tick is TTL/3 (dlock's " +
				"renewal interval). Heap and stack are the growth of the Go heap (after GC) and of " +
				"goroutine stacks per lease (0 when the stacks shrank). CPU is this process' user + system time during the " +
				"hold. One run.",
			applies: func(s *subject) string {
				if !s.renews {
					return "no auto-renewal in the library"
				}
				if strings.HasSuffix(s.id, "-fifo") {
					return "same as without FIFO here: nothing waits"
				}
				return ""
			},
			runs: func(config) int { return 1 }, measure: measureS5,
			columns: []column{
				{key: "leases", head: "leases"},
				{key: "fill s", head: "fill s", digits: 1, lowerBetter: true},
				{key: "rt/s", head: "round trips/s", digits: 1, lowerBetter: true},
				{key: "rt/1k/tick", head: "rt per 1k leases per tick", digits: 2, lowerBetter: true},
				{key: "srv/s", head: "server cmds/s", digits: 0, lowerBetter: true},
				{key: "cpu s", head: "client CPU s", digits: 2, lowerBetter: true},
				{key: "heap B/l", head: "heap B/lease", digits: 0, lowerBetter: true},
				{key: "stack B/l", head: "stack B/lease", digits: 0, lowerBetter: true},
				{key: "lost", head: "lost", digits: 0, lowerBetter: true},
				{key: "on server", head: "held on server", digits: 0},
			},
		},
		{
			id: "S6", title: "S6 — degraded Redlock: 5 nodes, 2 killed",
			about: "S1's loop (acquire + release, one goroutine) against five independent Redis " +
				"nodes of which %d are killed (connection refused), for %s per run, %d runs. " +
				"Compare with the same subject in S1 (all five up).",
			applies: func(s *subject) string {
				if s.server != srvRedis5 {
					return "single-server lock"
				}
				return ""
			},
			runs: runsN, measure: measureS6,
			setup: func(e *env, c config) (func() error, error) { return stopNodes(e, c.s6Down) },
			columns: append([]column{
				{key: "ops/s", head: "ops/s", ratio: true},
				{key: "acq p50", head: "acquire p50 µs", digits: 0, lowerBetter: true},
				{key: "acq p99", head: "acquire p99 µs", digits: 0, lowerBetter: true},
				{key: "errors", head: "failed cycles", digits: 0, lowerBetter: true},
			}, reqCols...),
		},
	}, kindScenarios()...)
}

// about fills in a scenario's description with the run's sizes.
func about(sc *scenario, c config) string {
	switch sc.id {
	case "S1":
		return fmt.Sprintf(sc.about, c.s1Dur, c.runs, c.ttl)
	case "S2":
		return fmt.Sprintf(sc.about, c.s2Dur, c.runs)
	case "S3":
		return fmt.Sprintf(sc.about, c.s3Dur, c.runs)
	case "S4":
		return fmt.Sprintf(sc.about, c.s4TTL, c.s4Reps)
	case "S5":
		return fmt.Sprintf(sc.about, num(float64(c.s5Leases), 0), opTimeout, c.s5TTL, c.s5Hold)
	case "S6":
		return fmt.Sprintf(sc.about, c.s6Down, c.s6Dur, c.runs)
	}
	return kindAbout(sc, c)
}
