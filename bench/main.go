// Command bench measures dlock's backends against the Go lock libraries
// people use (redsync, bsm/redislock, rueidislock, etcd's
// concurrency.Mutex, go-zookeeper's zk.Lock), a raw SET NX PX floor, a
// fenced floor (the least a lock with redislock's fencing tokens can do)
// and a hand-off floor (the least a lock with a server-side queue can do),
// on real servers it starts itself on loopback, and writes a markdown
// report with charts.
//
//	cd bench && go run . -out ../docs/BENCHMARKS.md          # everything (make bench)
//	cd bench && go run . -quick -scenarios S1,S3 -backends floor,redislock,bsm
//
// Scenarios: S1 uncontended, S2 parallel, S3 contended (hand-offs,
// fairness, requests per acquisition), S4 crash recovery, S5 100,000
// auto-renewed leases, S6 degraded Redlock; K1 semaphore against the raw
// sorted-set semaphore, K2 read holds against the mutex, K3 leader
// election fail-over. See docs/BENCHMARKS.md for what each measures and
// how.
//
// This module is the only place that imports the peer libraries.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/scale"
)

func main() {
	maybeHolder()
	if err := run1(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the command line.
type options struct {
	scenarios string
	backends  string
	out       string
	charts    string
	format    string
	quick     bool
	runs      int
	s5Leases  int
	render    string
	label     string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.scenarios, "scenarios", "S1,S2,S3,S4,S5,S6,K1,K2,K3", "comma-separated scenarios to run (S1…S6, K1…K3)")
	fs.StringVar(&o.backends, "backends", "all", "comma-separated subjects: floor, fenced-floor, fenced-floor5, fenced-floor-rueidis, handoff-floor, redislock, redislock-fifo, redlock, etcdlock, zklock, memlock, memlock-fifo, redsync, redsync5, bsm, rueidislock, etcd-mutex, zk-lock; or all")
	fs.StringVar(&o.out, "out", "", "markdown report to write (default: standard output)")
	fs.StringVar(&o.charts, "charts", "", "directory for the charts (default: bench/ next to -out; none without -out)")
	fs.StringVar(&o.format, "chart-format", "svg", "chart format: svg or png")
	fs.BoolVar(&o.quick, "quick", false, "short smoke run (well under a minute for S1+S3): one repetition, short durations, small S5")
	fs.IntVar(&o.runs, "runs", 0, "repetitions of S1, S2, S3, S6 and S4 (default 5, 1 with -quick)")
	fs.IntVar(&o.s5Leases, "s5-leases", 0, "leases S5 takes (default 100,000, 500 with -quick)")
	fs.StringVar(&o.label, "label", "", "what code is measured, for the report (default: git describe of the repository)")
	fs.StringVar(&o.render, "render", "", "render the report again from a results.json of an earlier run, without measuring")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if o.format != "svg" && o.format != "png" {
		return o, fmt.Errorf("-chart-format %q: want svg or png", o.format)
	}
	if o.runs < 0 {
		return o, fmt.Errorf("-runs %d: want ≥ 1", o.runs)
	}
	if o.s5Leases < 0 {
		return o, fmt.Errorf("-s5-leases %d: want ≥ 1", o.s5Leases)
	}
	return o, nil
}

// run1 parses args, runs the benchmark and writes the report.
func run1(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.render != "" {
		r, err := loadReport(o.render)
		if err != nil {
			return err
		}
		return write(r, o, stdout, stderr)
	}
	c := fullConfig()
	if o.quick {
		c = quickConfig()
		opTimeout = 5 * time.Second
	}
	if o.runs > 0 {
		c.runs, c.s4Reps = o.runs, o.runs
	}
	if o.s5Leases > 0 {
		c.s5Leases = o.s5Leases
	}
	subs, err := selectSubjects(o.backends)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, id := range strings.Split(o.scenarios, ",") {
		if id = strings.ToUpper(strings.TrimSpace(id)); id != "" {
			want[id] = true
		}
	}
	var scs, skipped []*scenario
	for _, sc := range allScenarios() {
		if want[sc.id] {
			scs = append(scs, sc)
			delete(want, sc.id)
		} else {
			skipped = append(skipped, sc)
		}
	}
	for id := range want {
		return fmt.Errorf("unknown scenario %q (known: S1…S6, K1…K3)", id)
	}

	// Quick runs measure subjects in parallel: one line at a time.
	var logMu sync.Mutex
	logf := func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	// go-redis logs every failed dial; S6 kills nodes on purpose.
	redis.SetLogger(quietRedisLogger{})
	e := newEnv(logf)
	defer e.close()

	r := &report{cmd: command(args), c: c, skipped: skipped, started: time.Now(), machine: machine(), libs: libVersions()}
	r.machine = append(r.machine, "Code measured: "+codeLabel(o.label))
	r.loadAvg[0] = scale.LoadAvg()
	for _, sc := range scs {
		logf("%s: %s", sc.id, sc.title)
		r.results = append(r.results, runScenario(e, c, sc, subs, logf))
	}
	r.duration = time.Since(r.started)
	r.loadAvg[1] = scale.LoadAvg()
	r.versions = e.versions()
	return write(r, o, stdout, stderr)
}

// write writes the report (and its charts and results.json) as o says.
func write(r *report, o options, stdout, stderr io.Writer) error {
	// Quick runs measure subjects in parallel: one line at a time.
	var logMu sync.Mutex
	logf := func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	if o.out != "" {
		dir := o.charts
		if dir == "" {
			dir = filepath.Join(filepath.Dir(o.out), "bench")
		}
		refs, err := writeCharts(r, dir, filepath.Dir(o.out), o.format)
		if err != nil {
			return err
		}
		r.charts = refs
		if o.render == "" {
			if err := r.save(filepath.Join(dir, "results.json")); err != nil {
				return err
			}
		}
		if err := os.WriteFile(o.out, []byte(r.markdown()), 0o644); err != nil {
			return err
		}
		logf("wrote %s and %d chart(s) in %s", o.out, len(refs), dir)
		return nil
	}
	if o.charts != "" {
		refs, err := writeCharts(r, o.charts, ".", o.format)
		if err != nil {
			return err
		}
		r.charts = refs
	}
	_, err := io.WriteString(stdout, r.markdown())
	return err
}

// command is the command line that reproduces this run, from the
// repository root.
func command(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \t\"'$") {
			a = fmt.Sprintf("%q", a)
		}
		quoted[i] = a
	}
	return strings.TrimSpace("cd bench && go run . " + strings.Join(quoted, " "))
}

type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

// codeLabel describes the dlock code being measured.
func codeLabel(label string) string {
	if label != "" {
		return label
	}
	out, err := exec.Command("git", "-C", "..", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	return "dlock " + strings.TrimSpace(string(out))
}
