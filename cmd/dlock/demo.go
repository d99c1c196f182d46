package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock/internal/testserver"
)

// Part outcomes.
const (
	statusPass = "PASS"
	statusFail = "FAIL"
	statusSkip = "SKIP"
)

// partResult is one part of the demo as reported.
type partResult struct {
	ID      string         `json:"id"`      // "a" .. "e"
	Title   string         `json:"title"`   // what it shows
	Status  string         `json:"status"`  // PASS, FAIL or SKIP
	Summary string         `json:"summary"` // one line for the table
	Details []string       `json:"details,omitempty"`
	Rows    []backendRow   `json:"backends,omitempty"` // part (e)
	Facts   map[string]any `json:"facts,omitempty"`    // the measured numbers
	Seconds float64        `json:"seconds"`
}

func (p *partResult) detail(format string, args ...any) {
	p.Details = append(p.Details, fmt.Sprintf(format, args...))
}

func (p *partResult) fact(name string, v any) {
	if p.Facts == nil {
		p.Facts = make(map[string]any)
	}
	p.Facts[name] = v
}

func (p *partResult) fail(format string, args ...any) {
	p.Status = statusFail
	p.detail("FAILED: "+format, args...)
}

// demoReport is the whole demo, as printed by --json.
type demoReport struct {
	Servers []string      `json:"servers"`
	Parts   []*partResult `json:"parts"`
	OK      bool          `json:"ok"`
	Seconds float64       `json:"seconds"`
}

// demoEnv is what the parts run on: the servers the demo started.
type demoEnv struct {
	g       *globals
	redis   *testserver.Redis   // always
	redlock []*testserver.Redis // 5 nodes, when the redlock backend is in this build
	etcd    *testserver.Etcd    // when etcdlock is in this build and etcd is installed
	zk      *testserver.ZooKeeper
	skip    map[string]string // backend -> why it is not available
}

func newDemoCmd(g *globals) *cobra.Command {
	var (
		asJSON bool
		only   string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show what locks and fencing tokens are for, on throwaway local servers",
		Long: `Run the inventory story of the dlock documentation end to end, on servers the demo starts
itself on free loopback ports (redis-server; etcd and ZooKeeper when installed) and stops
afterwards:

  (a) 3 service instances x 100 buyers, stock 100: without a lock the stock oversells;
      with dlock exactly 100 orders succeed and the stock ends at 0.
  (b) a holder frozen (SIGSTOP) past its TTL while another takes over: an unfenced store
      accepts its stale write, a fenced store rejects it.
  (c) the watchdog keeps a job that runs 4x the TTL locked (and without it, the lock is
      taken over mid-job).
  (d) Redlock keeps working with 2 of 5 nodes down, and refuses with 3 down.
  (e) the same contended workload on each backend, with its hand-offs per second.

It prints a report with a table and exits 0 when every part behaved as expected
(a part skipped because a server or backend is missing does not count as a failure).
--backend is ignored: the demo uses only its own servers.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			for _, c := range only {
				if c < 'a' || c > 'e' {
					return usageErrorf("demo: invalid --only %q: want letters among abcde", only)
				}
			}
			return runDemo(ctx, g, asJSON, only, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().StringVar(&only, "only", "", `run only these parts, e.g. "ab" (default all)`)
	g.addMetricsFlag(cmd)
	return cmd
}

func runDemo(ctx context.Context, g *globals, asJSON bool, only string, stdout io.Writer) error {
	start := time.Now()
	progress := stdout
	if asJSON {
		progress = io.Discard
	}
	fmt.Fprintln(progress, "dlock demo: starting throwaway servers on free loopback ports ...")
	env, err := startDemoServers()
	defer env.stop()
	if err != nil {
		return exitWith(exitFailure, fmt.Errorf("demo: %w", err))
	}
	env.g = g
	report := &demoReport{Servers: env.describe()}
	for _, s := range report.Servers {
		fmt.Fprintln(progress, "  "+s)
	}
	fmt.Fprintln(progress)

	parts := []struct {
		id, title string
		run       func(context.Context, *demoEnv, *partResult)
	}{
		{"a", "inventory: 3 instances x 100 buyers, stock 100", partInventory},
		{"b", "holder frozen past its TTL: unfenced vs fenced store", partFencing},
		{"c", "watchdog: a job running 4x the TTL", partWatchdog},
		{"d", "Redlock with 2 of 5 nodes down", partRedlock},
		{"e", "the same contended workload on each backend", partBackends},
	}
	report.OK = true
	for _, p := range parts {
		if only != "" && !strings.Contains(only, p.id) {
			continue
		}
		r := &partResult{ID: p.id, Title: p.title, Status: statusPass}
		t0 := time.Now()
		if ctx.Err() != nil {
			r.Status, r.Summary = statusFail, "interrupted"
		} else {
			p.run(ctx, env, r)
		}
		r.Seconds = time.Since(t0).Seconds()
		if r.Status == statusFail {
			report.OK = false
		}
		report.Parts = append(report.Parts, r)
		printPart(progress, r)
	}
	report.Seconds = time.Since(start).Seconds()
	if asJSON {
		if err := writeJSON(stdout, report); err != nil {
			return exitWith(exitFailure, err)
		}
	} else {
		printSummary(stdout, report)
	}
	if ctx.Err() != nil {
		return exitWith(130, errors.New("demo: interrupted"))
	}
	if !report.OK {
		return exitWith(exitFailure, errors.New("demo: some parts did not behave as expected (see FAIL above)"))
	}
	return nil
}

// startDemoServers starts the servers of the demo concurrently. Only a
// missing redis-server is an error; etcd and ZooKeeper are optional.
func startDemoServers() (*demoEnv, error) {
	env := &demoEnv{skip: make(map[string]string)}
	var wg sync.WaitGroup
	var redisErr, redlockErr, etcdErr, zkErr error
	wg.Go(func() {
		env.redis, redisErr = testserver.StartRedis(testserver.RedisOptions{})
	})
	if redlockAvailable {
		wg.Go(func() {
			env.redlock, redlockErr = testserver.StartRedisN(5, testserver.RedisOptions{})
		})
	} else {
		env.skip["redlock"] = "redlock backend not available in this build"
	}
	if etcdAvailable {
		wg.Go(func() {
			env.etcd, etcdErr = testserver.StartEtcd(testserver.EtcdOptions{})
		})
	}
	if zkAvailable {
		wg.Go(func() {
			env.zk, zkErr = testserver.StartZooKeeper(testserver.ZooKeeperOptions{TickTime: 500 * time.Millisecond})
		})
	}
	wg.Wait()
	// The optional servers' reasons are recorded once every goroutine is
	// done: skip is not safe for concurrent writes.
	for _, o := range []struct {
		backend, server string
		available       bool
		err             error
	}{
		{"etcd", "etcd", etcdAvailable, etcdErr},
		{"zookeeper", "ZooKeeper", zkAvailable, zkErr},
	} {
		switch {
		case !o.available:
			env.skip[o.backend] = o.backend + " backend not available in this build"
		case o.err != nil:
			env.skip[o.backend] = serverSkip(o.server, o.err)
		}
	}
	if redisErr != nil {
		if errors.Is(redisErr, testserver.ErrNotInstalled) {
			return env, fmt.Errorf("redis-server is needed: %w (`make demo` installs it)", redisErr)
		}
		return env, redisErr
	}
	if redlockErr != nil {
		env.skip["redlock"] = "could not start 5 redis-servers: " + firstLine(redlockErr.Error())
	}
	return env, nil
}

func serverSkip(name string, err error) string {
	if errors.Is(err, testserver.ErrNotInstalled) {
		return name + " not installed (" + firstLine(strings.TrimPrefix(err.Error(), "testserver: ")) + ")"
	}
	return name + " did not start: " + firstLine(err.Error())
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// stop stops every server the demo started.
func (e *demoEnv) stop() {
	var wg sync.WaitGroup
	stop := func(s interface{ Stop() error }) {
		wg.Go(func() {
			_ = s.Stop()
		})
	}
	if e.redis != nil {
		stop(e.redis)
	}
	for _, n := range e.redlock {
		stop(n)
	}
	if e.etcd != nil {
		stop(e.etcd)
	}
	if e.zk != nil {
		stop(e.zk)
	}
	wg.Wait()
}

func (e *demoEnv) describe() []string {
	s := []string{"redis-server  " + e.redis.Addr()}
	if len(e.redlock) > 0 {
		addrs := make([]string, len(e.redlock))
		for i, n := range e.redlock {
			addrs[i] = n.Addr()
		}
		s = append(s, "redlock nodes "+strings.Join(addrs, " "))
	}
	if e.etcd != nil {
		s = append(s, "etcd          "+strings.Join(e.etcd.Endpoints(), ","))
	}
	if e.zk != nil {
		s = append(s, "zookeeper     "+e.zk.Addr())
	}
	for _, name := range []string{"redlock", "etcd", "zookeeper"} {
		if why, ok := e.skip[name]; ok {
			s = append(s, fmt.Sprintf("%-13s skipped: %s", name, why))
		}
	}
	return s
}

func printPart(w io.Writer, r *partResult) {
	fmt.Fprintf(w, "(%s) %s — %s\n", r.ID, r.Title, r.Status)
	for _, d := range r.Details {
		fmt.Fprintln(w, "    "+d)
	}
	if len(r.Rows) > 0 {
		printBackendTable(w, r.Rows, "    ")
	}
	fmt.Fprintln(w)
}

func printSummary(w io.Writer, rep *demoReport) {
	fmt.Fprintln(w, "Summary")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  part\tresult\ttime\twhat happened")
	for _, p := range rep.Parts {
		fmt.Fprintf(tw, "  (%s)\t%s\t%.1fs\t%s\n", p.ID, p.Status, p.Seconds, p.Summary)
	}
	_ = tw.Flush()
	verdict := "every part behaved as expected"
	if !rep.OK {
		verdict = "SOME PARTS FAILED"
	}
	fmt.Fprintf(w, "\n%s (%.1fs)\n", verdict, rep.Seconds)
}
