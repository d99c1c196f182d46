package main

import (
	"bytes"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The runner is a command (package main), so its tests live in the package;
// they drive it only through run1, its command line.

func TestMain(m *testing.M) {
	maybeHolder() // S4 re-executes the test binary as a crash holder
	goleak.VerifyTestMain(m,
		// Process-wide goroutines the peer libraries start once and never stop.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

// quickRun runs the runner with args, writing the report to out (or to
// stdout if out is ""), and returns the report and the log. It skips the
// test with -short (why says what the run does) or when a server of bins
// is not installed, and fails it if the run fails.
func quickRun(t *testing.T, why string, bins []string, out string, args ...string) (md, log string) {
	t.Helper()
	if testing.Short() {
		t.Skip(why + "; skipped with -short")
	}
	for _, bin := range bins {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (scripts/install-servers.sh installs it)", bin)
		}
	}
	if out != "" {
		args = append(args, "-out", out)
	}
	var stdout, stderr bytes.Buffer
	if err := run1(append([]string{"-quick"}, args...), &stdout, &stderr); err != nil {
		t.Fatalf("run1: got error %v, want nil; log:\n%s", err, stderr.String())
	}
	if out == "" {
		return stdout.String(), stderr.String()
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), stderr.String()
}

// TestQuickRun runs the runner in quick mode on S1 and S3 for dlock's
// redislock, one peer and three floors, and checks that the report has its
// tables, rows and charts. It does not judge the figures.
func TestQuickRun(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	md, log := quickRun(t, "starts redis-server and runs the benchmark for ~10 s", []string{"redis-server"},
		filepath.Join(dir, "BENCHMARKS.md"), "-scenarios", "S1,S3", "-backends", "floor,fenced-floor,handoff-floor,redislock,bsm")
	t.Logf("quick run took %v", time.Since(start).Round(time.Millisecond))
	for _, want := range []string{
		"## Machine", "## Targets", "## S1 — uncontended", "## S3 — contended",
		"| backend | server | ops/s | × floor | × best peer |",
		"| backend | server | waits by | acq/s | hand-offs/s |",
		"| **dlock redislock** | Redis |", "| bsm/redislock | Redis |", "| floor: SET NX PX + Lua delete | Redis |",
		"| fenced floor: 2-call Lua acquire + 2-call Lua release | Redis |",
		"S1 (for information, no target): dlock redislock against the fenced floor",
		"| hand-off floor: Lua queue + one PUBLISH per release | Redis | server-side queue, one PUBLISH per release |",
		"S3 (for information, no target): dlock redislock (default options) against the hand-off floor (hand-offs/s)",
		"cd bench && go run . -quick -scenarios S1,S3",
		"![S1 latency](bench/s1_latency.svg)", "![S3 hand-offs and fairness](bench/s3_handoffs_fairness.svg)",
		"S2 — parallel: 32 goroutines on 32 keys, one client: not selected",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q; got:\n%s", want, md)
		}
	}
	// Each subject's rows appear in both tables.
	if got := strings.Count(md, "| **dlock redislock** | Redis |"); got != 2 {
		t.Errorf("dlock redislock rows: got %d, want 2 (S1 and S3)", got)
	}
	if strings.Contains(md, "every run failed") {
		t.Errorf("a subject failed every run:\n%s\nlog:\n%s", md, log)
	}
	for _, name := range []string{"s1_latency.svg", "s3_handoffs_fairness.svg"} {
		fi, err := os.Stat(filepath.Join(dir, "bench", name))
		if err != nil {
			t.Errorf("chart %s: %v", name, err)
		} else if fi.Size() == 0 {
			t.Errorf("chart %s: got 0 bytes, want an image", name)
		}
	}
}

// TestQuickS5 runs S5 in quick mode with -s5-leases for dlock's redislock
// and memlock (each in its measurement child) and checks the table: the
// leases asked for, all taken, none lost.
func TestQuickS5(t *testing.T) {
	md, log := quickRun(t, "starts redis-server and holds leases for a few seconds", []string{"redis-server"},
		"", "-scenarios", "S5", "-backends", "redislock,memlock", "-s5-leases", "300")
	for _, want := range []string{
		"One client takes 300 leases",
		"| **dlock redislock** | Redis | 300 |",
		"| **dlock memlock** | in-process | 300 |",
		"| S5: dlock redislock — no lease lost | 0 of 300 lost; 300 held on the server | ✅ met |",
		"| S5: dlock memlock — no lease lost | 0 of 300 lost | ✅ met |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q; got:\n%s\nlog:\n%s", want, md, log)
		}
	}
	if strings.Contains(md, "Incomplete fills") {
		t.Errorf("report says a fill was incomplete:\n%s", md)
	}
}

func TestBadCommandLine(t *testing.T) {
	for _, args := range [][]string{
		{"-scenarios", "S9"},
		{"-backends", "nosuch"},
		{"-chart-format", "gif"},
		{"-runs", "-1"},
		{"-s5-leases", "-1"},
		{"stray"},
	} {
		err := run1(args, io.Discard, io.Discard)
		if err == nil {
			t.Errorf("run1(%q): got nil error, want one", args)
		}
	}
}

func TestJain(t *testing.T) {
	for _, c := range []struct {
		xs   []int64
		want float64
	}{
		{[]int64{5, 5, 5, 5}, 1},
		{[]int64{8, 0, 0, 0}, 0.25},
		{[]int64{1, 3}, 0.8},
	} {
		if got := jain(c.xs); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("jain(%v): got %v, want %v", c.xs, got, c.want)
		}
	}
	if got := jain([]int64{0, 0}); !math.IsNaN(got) {
		t.Errorf("jain of no acquisitions: got %v, want NaN", got)
	}
}

func TestPercentileAndMedian(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3, 10, 6, 7, 9, 8}
	if got := percentile(ds, 50); got != 5 {
		t.Errorf("p50: got %v, want 5", got)
	}
	if got := percentile(ds, 99); got != 10 {
		t.Errorf("p99: got %v, want 10", got)
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median odd: got %v, want 2", got)
	}
	if got := median([]float64{4, 1, 2, 3}); got != 2.5 {
		t.Errorf("median even: got %v, want 2.5", got)
	}
}

func TestNum(t *testing.T) {
	for _, c := range []struct {
		v      float64
		digits int
		want   string
	}{
		{1234567.891, 0, "1,234,568"},
		{999, 0, "999"},
		{-1234.5, 1, "-1,234.5"},
		{0.987, 3, "0.987"},
		{math.NaN(), 2, "—"},
	} {
		if got := num(c.v, c.digits); got != c.want {
			t.Errorf("num(%v, %d): got %q, want %q", c.v, c.digits, got, c.want)
		}
	}
}

// TestCountConn: a request is a burst of writes after a read; pushed
// bytes are not requests.
func TestCountConn(t *testing.T) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	c := &counter{}
	conn := c.wrap(a)
	go func() { // the "server": reads 3 writes, answers, pushes twice
		buf := make([]byte, 16)
		for range 3 {
			_, _ = b.Read(buf)
		}
		_, _ = b.Write([]byte("reply"))
		_, _ = b.Write([]byte("push"))
		for range 1 {
			_, _ = b.Read(buf)
		}
	}()
	buf := make([]byte, 16)
	for _, p := range []string{"a", "b", "c"} { // one pipeline in three writes
		if _, err := conn.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Read(buf); err != nil { // reply
		t.Fatal(err)
	}
	if _, err := conn.Read(buf); err != nil { // push
		t.Fatal(err)
	}
	if got := c.requests.Load(); got != 1 {
		t.Errorf("after one pipeline and a push: got %d requests, want 1", got)
	}
	if _, err := conn.Write([]byte("d")); err != nil {
		t.Fatal(err)
	}
	if got := c.requests.Load(); got != 2 {
		t.Errorf("after a second request: got %d requests, want 2", got)
	}
}
