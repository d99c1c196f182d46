package verify_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/verify"
)

// shortConfig is a run small enough for make test.
func shortConfig(t *testing.T, fault string) verify.Config {
	t.Helper()
	cfg := verify.DefaultConfig()
	cfg.BackendURL = "redis://local"
	cfg.Name = "redislock"
	cfg.Faults = []string{fault}
	cfg.Duration = 8 * time.Second
	cfg.Workers = 3
	cfg.TTL = 400 * time.Millisecond
	cfg.Seed = 7
	cfg.OutDir = outDir(t)
	cfg.Exe = workerExe(t)
	cfg.Progress = func(msg string) { t.Log(msg) }
	return cfg
}

// inProcessConfig is a run without faults of workers goroutines of the
// test process on backend url, for d with leases of ttl, into outDir.
func inProcessConfig(t *testing.T, url, name string, d, ttl time.Duration, workers int) verify.Config {
	cfg := verify.DefaultConfig()
	cfg.BackendURL, cfg.Name = url, name
	cfg.InProcess = true
	cfg.Faults = []string{verify.FaultNone}
	cfg.Duration, cfg.TTL, cfg.Workers = d, ttl, workers
	cfg.OutDir = outDir(t)
	return cfg
}

// outDir is a temporary directory, or $DLOCK_VERIFY_KEEP to keep the
// histories and timelines for a look.
func outDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("DLOCK_VERIFY_KEEP"); d != "" {
		return d
	}
	return t.TempDir()
}

func runOne(t *testing.T, cfg verify.Config) *verify.RunResult {
	t.Helper()
	rep, err := verify.Run(context.Background(), cfg, open)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := len(rep.Runs); got != 1 {
		t.Fatalf("got %d runs, want 1", got)
	}
	t.Logf("\n%s", rep.Table())
	return rep.Runs[0]
}

// assertPassed asserts that run's verdict is PASS and that it made at
// least grants grants.
func assertPassed(t *testing.T, run *verify.RunResult, grants int) {
	t.Helper()
	f := run.Findings
	if got := run.Verdict(); got != "PASS" {
		t.Errorf("got verdict %s (violations %q, invalid %q), want PASS", got, f.Violations(), f.Invalid)
	}
	if f.Grants < grants {
		t.Errorf("got %d grants, want at least %d", f.Grants, grants)
	}
}

// assertPausesCaught asserts what a run under holder pauses must show: no
// lease overlap, fences only going up, a fenced register that accepted no
// stale write and lost nothing, a naive register (the negative control)
// that saw what the fence prevented, and the verdict PASS.
func assertPausesCaught(t *testing.T, run *verify.RunResult) {
	t.Helper()
	f := run.Findings
	if n := len(f.LeaseOverlaps); n != 0 {
		t.Errorf("got %d lease overlaps, want 0: %+v", n, f.LeaseOverlaps[0])
	}
	if n := len(f.FenceRegressions); n != 0 {
		t.Errorf("got %d fence regressions, want 0: %+v", n, f.FenceRegressions[0])
	}
	if f.Fenced == nil || f.Naive == nil {
		t.Fatalf("got fenced %v, naive %v findings, want both", f.Fenced, f.Naive)
	}
	if f.Fenced.StaleAccepted != 0 || f.Fenced.LostUpdates != 0 {
		t.Errorf("fenced register: got %d stale writes accepted, %d lost updates, want 0 and 0", f.Fenced.StaleAccepted, f.Fenced.LostUpdates)
	}
	if f.Naive.LostUpdates == 0 && f.Naive.StaleAccepted == 0 {
		t.Errorf("naive register: got no lost updates and no stale writes under pauses, want violations")
	}
	if got := run.Verdict(); got != "PASS" {
		t.Errorf("got verdict %s (violations %q, invalid %q), want PASS", got, f.Violations(), f.Invalid)
	}
}

// The acceptance test of make test: single-node Redis under process
// pauses keeps its server-side promises (no lease overlap, fences only go
// up, the fenced register accepts no stale write and loses nothing),
// while the naive register — the negative control — loses updates.
func TestPauseRedislock(t *testing.T) {
	run := runOne(t, shortConfig(t, verify.FaultPause))
	f := run.Findings
	if f.Grants < 10 {
		t.Errorf("got %d grants, want at least 10", f.Grants)
	}
	assertPausesCaught(t, run)
	if f.Fenced.Linearizable != "Ok" {
		t.Errorf("fenced register: got linearizability %q, want Ok", f.Fenced.Linearizable)
	}
	if f.Fenced.WritesStale == 0 && f.Fenced.ReadsRejected == 0 {
		t.Errorf("fenced register rejected nothing: the pauses never made a holder stale")
	}
	if f.Naive.LostUpdates > 0 && f.Naive.Linearizable == "Ok" {
		t.Errorf("naive register lost %d updates but porcupine found its history linearizable", f.Naive.LostUpdates)
	}
	if f.BeliefOverlaps == 0 {
		t.Errorf("got no belief overlap under pauses, want some")
	}
	if len(f.QuietMissing) != 0 {
		t.Errorf("workers %v did not acquire in the quiet phase", f.QuietMissing)
	}
	if len(f.Liveness) == 0 {
		t.Errorf("got no liveness samples, want one per effective pause")
	}
	for _, x := range []*verify.ResourceFindings{f.Fenced, f.Naive} {
		if _, err := os.Stat(x.Visualization); err != nil {
			t.Errorf("%s timeline: %v", x.Name, err)
		}
	}
}

func TestBadInput(t *testing.T) {
	base := func() verify.Config {
		cfg := verify.DefaultConfig()
		cfg.OutDir = t.TempDir()
		cfg.Exe = workerExe(t)
		return cfg
	}
	tests := []struct {
		name   string
		modify func(*verify.Config)
		want   error
		substr string
	}{
		{"unknown fault", func(c *verify.Config) { c.Faults = []string{"pause", "earthquake"} }, verify.ErrInvalidConfig, `unknown fault "earthquake"`},
		{"no faults", func(c *verify.Config) { c.Faults = nil }, verify.ErrInvalidConfig, "no faults"},
		{"zero workers", func(c *verify.Config) { c.Workers = 0 }, verify.ErrInvalidConfig, "workers must be at least 2"},
		{"one worker", func(c *verify.Config) { c.Workers = 1 }, verify.ErrInvalidConfig, "got 1"},
		{"short duration", func(c *verify.Config) { c.Duration = time.Second }, verify.ErrInvalidConfig, "at least 10 × TTL"},
		{"tiny TTL", func(c *verify.Config) { c.TTL = time.Millisecond }, verify.ErrInvalidConfig, "TTL 1ms"},
		{"zero runs", func(c *verify.Config) { c.Runs = 0 }, verify.ErrInvalidConfig, "runs"},
		{"bad mode", func(c *verify.Config) { c.ResourceMode = "trusting" }, verify.ErrInvalidConfig, `resource mode "trusting"`},
		{"no exe", func(c *verify.Config) { c.Exe = nil }, verify.ErrInvalidConfig, "Exe"},
		{"exe not found", func(c *verify.Config) {
			c.Exe = []string{"/nonexistent/dlock"}
			c.Duration = 2 * time.Second
			c.TTL = 100 * time.Millisecond
		}, nil, "start worker w1.0"},
		{"worker that is not one", func(c *verify.Config) {
			c.Exe = []string{"/bin/sh", "-c", "echo nope >&2; exit 3"}
			c.Duration = 2 * time.Second
			c.TTL = 100 * time.Millisecond
		}, nil, "nope"},
		{"no scheme", func(c *verify.Config) { c.BackendURL = "127.0.0.1:6379" }, verify.ErrInvalidConfig, "SCHEME://"},
		{"local etc", func(c *verify.Config) { c.BackendURL = "consul://local" }, verify.ErrInvalidConfig, "can start servers only"},
		{"restart needs local", func(c *verify.Config) {
			c.BackendURL = "redis://127.0.0.1:6379"
			c.Faults = []string{verify.FaultRestart}
		}, verify.ErrInvalidConfig, "use redis://local"},
		{"in-process pause", func(c *verify.Config) {
			c.BackendURL = "mem://"
			c.InProcess = true
		}, verify.ErrInvalidConfig, "needs worker processes"},
		{"backend does not answer", func(c *verify.Config) {
			c.BackendURL = "redis://127.0.0.1:1"
			c.Duration = 2 * time.Second
			c.TTL = 100 * time.Millisecond
		}, verify.ErrUnavailable, "redis://127.0.0.1:1"},
		{"FIFO without a queue", func(c *verify.Config) {
			c.BackendURL = "broken://"
			c.InProcess = true
			c.Faults = []string{verify.FaultNone}
			c.FIFO = true
			c.Duration = 2 * time.Second
			c.TTL = 100 * time.Millisecond
		}, verify.ErrInvalidConfig, "cannot queue waiters"},
		{"unknown scheme for the factory", func(c *verify.Config) {
			c.BackendURL = "consul://127.0.0.1:8500"
			c.Duration = 2 * time.Second
			c.TTL = 100 * time.Millisecond
		}, nil, "unsupported backend URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base()
			tt.modify(&cfg)
			_, err := verify.Run(context.Background(), cfg, open)
			if err == nil {
				t.Fatalf("got no error, want one containing %q", tt.substr)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("got error %q, want one matching %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.substr) || !strings.HasPrefix(err.Error(), "verify: ") {
				t.Errorf("got error %q, want it to start with \"verify: \" and contain %q", err, tt.substr)
			}
		})
	}
	if _, err := verify.Run(context.Background(), base(), nil); !errors.Is(err, verify.ErrInvalidConfig) {
		t.Errorf("nil OpenFunc: got %v, want ErrInvalidConfig", err)
	}
}

// In-process workers on memlock: the baseline without faults passes.
// Belief overlaps can still happen when the whole test process is starved
// of CPU past the TTL (a natural pause): the fence then rejects the stale
// write, and the check must still pass.
func TestInProcessMemlock(t *testing.T) {
	run := runOne(t, inProcessConfig(t, "mem://", "memlock", 2*time.Second, 200*time.Millisecond, 4))
	f := run.Findings
	assertPassed(t, run, 10)
	if len(f.LeaseOverlaps) != 0 || len(f.FenceRegressions) != 0 || f.Fenced.Linearizable != "Ok" {
		t.Errorf("got %d lease overlaps, %d fence regressions, fenced %q; want 0, 0, Ok",
			len(f.LeaseOverlaps), len(f.FenceRegressions), f.Fenced.Linearizable)
	}
	if f.BeliefOverlaps > 0 {
		t.Logf("%d belief overlaps without faults: the process was starved past the TTL", f.BeliefOverlaps)
	}
}

// Every other fault runs and has its effect; single-node Redis keeps its
// fences in order under all of them.
func TestFaults(t *testing.T) {
	for _, fault := range []string{verify.FaultKill, verify.FaultRestart, verify.FaultRestartPersist, verify.FaultServerPause, verify.FaultProxy} {
		t.Run(fault, func(t *testing.T) {
			cfg := shortConfig(t, fault)
			cfg.Duration = 6 * time.Second
			run := runOne(t, cfg)
			f := run.Findings
			if len(f.Invalid) > 0 {
				t.Errorf("run invalid: %q", f.Invalid)
			}
			if n := len(f.FenceRegressions); n != 0 {
				t.Errorf("got %d fence regressions, want 0", n)
			}
			if f.Fenced.StaleAccepted != 0 || f.Fenced.LostUpdates != 0 || f.Fenced.Linearizable == "Illegal" {
				t.Errorf("fenced register: got %d stale accepted, %d lost, %s; want 0, 0, not Illegal", f.Fenced.StaleAccepted, f.Fenced.LostUpdates, f.Fenced.Linearizable)
			}
			t.Logf("violations: %q", f.Violations())
		})
	}
}

// A lock that excludes nothing must fail: lease overlaps are reported, the
// naive register loses updates, and the fence still protects the fenced
// register.
func TestBrokenLockIsCaught(t *testing.T) {
	run := runOne(t, inProcessConfig(t, "broken://", "broken", time.Second, 100*time.Millisecond, 3))
	f := run.Findings
	if got := run.Verdict(); got != "FAIL" {
		t.Errorf("got verdict %s, want FAIL", got)
	}
	if len(f.LeaseOverlaps) == 0 || f.BeliefOverlaps == 0 {
		t.Errorf("got %d lease overlaps, %d belief overlaps; want both > 0", len(f.LeaseOverlaps), f.BeliefOverlaps)
	}
	if f.Naive.LostUpdates == 0 || f.Naive.Linearizable != "Illegal" {
		t.Errorf("naive register: got %d lost updates, %s; want > 0, Illegal", f.Naive.LostUpdates, f.Naive.Linearizable)
	}
	if f.Fenced.StaleAccepted != 0 || f.Fenced.LostUpdates != 0 || f.Fenced.Linearizable != "Ok" {
		t.Errorf("fenced register: got %d stale accepted, %d lost, %s; want 0, 0, Ok", f.Fenced.StaleAccepted, f.Fenced.LostUpdates, f.Fenced.Linearizable)
	}
}

// Cancelling the context stops a run promptly and leaves nothing behind
// (goleak checks the goroutines; the servers and workers are killed).
func TestCancel(t *testing.T) {
	cfg := shortConfig(t, verify.FaultPause)
	cfg.Duration = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Progress = func(msg string) {
		t.Log(msg)
		if strings.Contains(msg, "workers up") {
			time.AfterFunc(time.Second, cancel)
		}
	}
	start := time.Now()
	_, err := verify.Run(ctx, cfg, open)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Run took %v after cancellation, want it prompt", d)
	}
}

// ReadReport reads back the runs of separate calls of Run: the same rows
// as merging their Reports, in a stable order.
func TestReadReport(t *testing.T) {
	cfg := inProcessConfig(t, "mem://", "", 500*time.Millisecond, 50*time.Millisecond, 2)
	var reps []*verify.Report
	var dirs []string
	for i, name := range []string{"mem-b", "mem-a"} {
		c := cfg
		c.Name = name
		c.Runs = 2 - i
		c.OutDir = t.TempDir()
		rep, err := verify.Run(context.Background(), c, open)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		reps = append(reps, rep)
		dirs = append(dirs, c.OutDir)
	}
	got, err := verify.ReadReport(dirs...)
	if err != nil {
		t.Fatalf("ReadReport: %v", err)
	}
	want := reps[0].Merge(reps[1])
	if g, w := fmt.Sprint(got.Rows()), fmt.Sprint(want.Rows()); g != w {
		t.Errorf("got rows\n%s\nwant\n%s", g, w)
	}
	var order []string
	for _, r := range got.Runs {
		order = append(order, fmt.Sprintf("%s/%s/%d", r.Backend, r.Fault, r.Seed))
	}
	if g, w := strings.Join(order, " "), "mem-b/none/1 mem-b/none/2 mem-a/none/1"; g != w {
		t.Errorf("got runs %s, want %s", g, w)
	}
	if _, err := verify.ReadReport(t.TempDir()); err == nil {
		t.Error("ReadReport of an empty directory: got nil error, want one")
	}
}

// FIFO mode on single-node Redis: the workers wait in redislock's queue and
// take the lock from a release's hand-off message, without a claim request
// (the lease counts from their last heartbeat, for the claim TTL, until the
// first renewal). Under holder pauses it keeps the same promises, and the
// report marks the run as FIFO.
func TestFIFORedislock(t *testing.T) {
	cfg := shortConfig(t, verify.FaultPause)
	cfg.FIFO = true
	run := runOne(t, cfg)
	f := run.Findings
	assertPassed(t, run, 10)
	if len(f.LeaseOverlaps) != 0 || len(f.FenceRegressions) != 0 || f.Fenced.StaleAccepted != 0 || f.Fenced.LostUpdates != 0 {
		t.Errorf("got %d lease overlaps, %d fence regressions, %d stale writes accepted, %d updates lost; want 0 each",
			len(f.LeaseOverlaps), len(f.FenceRegressions), f.Fenced.StaleAccepted, f.Fenced.LostUpdates)
	}
	if !run.FIFO || run.Label() != "redislock (FIFO)" {
		t.Errorf("got FIFO %v, label %q; want true, %q", run.FIFO, run.Label(), "redislock (FIFO)")
	}
	md, err := os.ReadFile(filepath.Join(cfg.OutDir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| redislock (FIFO) | pause |") || !strings.Contains(string(md), "dlock.WithFIFO()") {
		t.Errorf("report.md does not mark the run as FIFO:\n%s", md)
	}
	back, err := verify.ReadReport(cfg.OutDir)
	if err != nil {
		t.Fatal(err)
	}
	if rows := back.Rows(); len(rows) != 1 || !rows[0].FIFO {
		t.Errorf("ReadReport: got rows %+v, want one FIFO row", rows)
	}
}

// Config.FIFO reaches the worker processes' Acquire calls: a FIFO waiter
// joins redislock's server-side queue, a sorted set (ZADD in queue.lua;
// no other script of redislock adds to a sorted set). On a server of its
// own, a run with FIFO leaves ZADD calls in the command statistics.
// (Without FIFO, contended waits use the queue too: redislock's default.)
func TestFIFOReachesWorkers(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			srv, err := testserver.StartRedis(testserver.RedisOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := srv.Stop(); err != nil {
					t.Error(err)
				}
			})
			cfg := verify.DefaultConfig()
			cfg.BackendURL = "redis://" + srv.Addr()
			cfg.Name = "redislock"
			cfg.Faults = []string{verify.FaultNone}
			cfg.FIFO = fifo
			cfg.Duration = 2 * time.Second
			cfg.TTL = 200 * time.Millisecond
			cfg.Workers = 3
			cfg.OutDir = t.TempDir()
			cfg.Exe = workerExe(t)
			run := runOne(t, cfg)
			if got := run.Verdict(); got != "PASS" {
				t.Errorf("got verdict %s (violations %q, invalid %q), want PASS", got, run.Findings.Violations(), run.Findings.Invalid)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			v, err := srv.Do(ctx, "INFO", "commandstats")
			if err != nil {
				t.Fatal(err)
			}
			info, _ := v.(string)
			var zadds string
			for _, line := range strings.Split(info, "\n") {
				if strings.HasPrefix(line, "cmdstat_zadd:") {
					zadds = strings.TrimSpace(line)
				}
			}
			// redislock waits in its queue by default too: only the FIFO
			// run is required to reach it.
			if queued := zadds != ""; fifo && !queued {
				t.Errorf("got ZADD statistics %q after %d grants, want the queue used", zadds, run.Findings.Grants)
			}
		})
	}
}
