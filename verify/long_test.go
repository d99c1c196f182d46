package verify_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/verify"
)

// TestLong runs longer experiments when DLOCK_VERIFY_LONG is set, on
// redis://local or, with DLOCK_VERIFY_BACKEND=mem://, on memlock with
// in-process workers (the one way to run memlock, which the dlock CLI
// cannot share between worker processes):
//
//	DLOCK_VERIFY_LONG=1 DLOCK_VERIFY_FAULTS=pause,kill DLOCK_VERIFY_RUNS=10 \
//	DLOCK_VERIFY_DURATION=60s DLOCK_VERIFY_KEEP=/tmp/verify go test -run TestLong -timeout 0 -v
//
//	DLOCK_VERIFY_LONG=1 DLOCK_VERIFY_BACKEND=mem:// DLOCK_VERIFY_RUNS=10 \
//	DLOCK_VERIFY_DURATION=60s DLOCK_VERIFY_KEEP=/tmp/verify go test -run TestLong -timeout 0 -v
//
// Optional: DLOCK_VERIFY_WORKERS (5), DLOCK_VERIFY_TTL (1s), DLOCK_VERIFY_SEED (1).
func TestLong(t *testing.T) {
	if os.Getenv("DLOCK_VERIFY_LONG") == "" {
		t.Skip("set DLOCK_VERIFY_LONG=1 to run")
	}
	cfg := verify.DefaultConfig()
	cfg.Name = "redislock"
	cfg.Exe = workerExe(t)
	if u := os.Getenv("DLOCK_VERIFY_BACKEND"); strings.HasPrefix(u, "mem://") {
		cfg.BackendURL, cfg.Name, cfg.InProcess, cfg.Exe = u, "memlock", true, nil
		cfg.Faults = []string{verify.FaultNone}
	}
	cfg.OutDir = outDir(t)
	cfg.Progress = func(msg string) { t.Log(msg) }
	if s := os.Getenv("DLOCK_VERIFY_FAULTS"); s != "" {
		cfg.Faults = strings.Split(s, ",")
	}
	env := func(name string, parse func(string) error) {
		if s := os.Getenv(name); s != "" {
			if err := parse(s); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
	env("DLOCK_VERIFY_RUNS", func(s string) (err error) { cfg.Runs, err = strconv.Atoi(s); return })
	env("DLOCK_VERIFY_WORKERS", func(s string) (err error) { cfg.Workers, err = strconv.Atoi(s); return })
	env("DLOCK_VERIFY_SEED", func(s string) (err error) { cfg.Seed, err = strconv.ParseInt(s, 10, 64); return })
	env("DLOCK_VERIFY_DURATION", func(s string) (err error) { cfg.Duration, err = time.ParseDuration(s); return })
	env("DLOCK_VERIFY_TTL", func(s string) (err error) { cfg.TTL, err = time.ParseDuration(s); return })
	rep, err := verify.Run(context.Background(), cfg, open)
	if rep != nil {
		t.Logf("\n%s", rep.Table())
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestMergeReports writes one markdown report over the runs below the
// directories listed in DLOCK_VERIFY_MERGE (comma-separated), e.g. the
// --out directories of campaigns run in parallel by separate processes,
// to DLOCK_VERIFY_MERGE_OUT (default: the test log):
//
//	DLOCK_VERIFY_MERGE=/tmp/a,/tmp/b DLOCK_VERIFY_MERGE_OUT=/tmp/report.md go test -run TestMergeReports -v
func TestMergeReports(t *testing.T) {
	dirs := os.Getenv("DLOCK_VERIFY_MERGE")
	if dirs == "" {
		t.Skip("set DLOCK_VERIFY_MERGE=DIR,DIR... to run")
	}
	rep, err := verify.ReadReport(strings.Split(dirs, ",")...)
	if err != nil {
		t.Fatal(err)
	}
	md := "# dlock verify\n\n" + rep.Markdown()
	if out := os.Getenv("DLOCK_VERIFY_MERGE_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("\n%s", md)
	}
	if !rep.OK() {
		t.Errorf("a run failed or was invalid:\n%s", rep.Table())
	}
}

// TestRecheck checks the saved histories of earlier runs again with the
// current checker and rewrites their summary files (the timelines are
// kept), for the runs below the directories in DLOCK_VERIFY_RECHECK
// (comma-separated). Runs saved before RunResult.TTL existed need
// DLOCK_VERIFY_TTL for each directory, comma-separated in the same order:
//
//	DLOCK_VERIFY_RECHECK=/tmp/redis,/tmp/etcd DLOCK_VERIFY_TTL=1s,2s go test -run TestRecheck -v
func TestRecheck(t *testing.T) {
	list := os.Getenv("DLOCK_VERIFY_RECHECK")
	if list == "" {
		t.Skip("set DLOCK_VERIFY_RECHECK=DIR,DIR... to run")
	}
	dirs := strings.Split(list, ",")
	var ttls []string
	if s := os.Getenv("DLOCK_VERIFY_TTL"); s != "" {
		ttls = strings.Split(s, ",")
	}
	for i, dir := range dirs {
		rep, err := verify.ReadReport(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, run := range rep.Runs {
			if run.TTL == 0 && i < len(ttls) {
				if run.TTL, err = time.ParseDuration(ttls[i]); err != nil {
					t.Fatalf("DLOCK_VERIFY_TTL: %v", err)
				}
			}
			if run.TTL == 0 {
				t.Fatalf("%s: no TTL saved; set DLOCK_VERIFY_TTL", run.Dir)
			}
			evs, err := verify.ReadHistory(filepath.Join(run.Dir, "history"))
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, k := range strings.Split(run.Fault, "+") {
				if k != verify.FaultNone {
					kinds = append(kinds, k)
				}
			}
			f, err := verify.Check(evs, verify.CheckOptions{TTL: run.TTL, Faults: kinds})
			if err != nil {
				t.Fatal(err)
			}
			for _, pair := range [][2]*verify.ResourceFindings{{f.Fenced, run.Findings.Fenced}, {f.Naive, run.Findings.Naive}} {
				if pair[0] != nil && pair[1] != nil {
					pair[0].Visualization = pair[1].Visualization
				}
			}
			if before, after := run.Verdict(), f.Verdict(); before != after {
				t.Logf("%s: %s, was %s", run.Dir, after, before)
			}
			run.Findings = f
			b, err := json.MarshalIndent(run, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(run.Dir, verify.SummaryFile), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: %d runs checked again", dir, len(rep.Runs))
	}
}
