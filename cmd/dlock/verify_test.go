//go:build unix

package main_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// verifyRun runs `dlock verify` with args and the test's own environment
// (verify picks its servers itself), and returns what it printed and how
// it exited.
func verifyRun(args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(bin, append([]string{"verify"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// verifyPasses runs `dlock verify` with args, fails the test unless it
// exits 0, and returns its report from stdout.
func verifyPasses(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := verifyRun(args...)
	if err != nil {
		t.Fatalf("dlock verify %s: got %v, want success\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout
}

// TestVerify runs `dlock verify` end to end: worker processes re-executed
// from this binary, a pause fault, the negative control on the naive
// register.
func TestVerify(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an 8 s verification")
	}
	out := t.TempDir()
	report := verifyPasses(t, "--faults", "pause", "--duration", "8s", "--runs", "1", "--workers", "3", "--ttl", "400ms", "--out", out)
	if !strings.Contains(report, "PASS") {
		t.Fatalf("verify report without PASS:\n%s", report)
	}
	if _, err := os.Stat(out + "/report.md"); err != nil {
		t.Fatalf("report.md not written: %v", err)
	}
}

// TestVerifyZooKeeperSession runs `dlock verify` on zk://local with holder
// pauses. The workers' ZooKeeper sessions must time out with the lease TTL:
// with a longer session a paused holder keeps its lock node for the whole
// pause, nobody takes the lock, and the run is INVALID (exit status 1).
func TestVerifyZooKeeperSession(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 10 s verification on ZooKeeper")
	}
	report := verifyPasses(t, "--backend", "zk://local", "--faults", "pause", "--duration", "10s", "--runs", "1",
		"--workers", "3", "--ttl", "1s", "--out", t.TempDir())
	if !strings.Contains(report, "PASS") {
		t.Fatalf("got report without PASS, want the pause run passed:\n%s", report)
	}
}

// TestVerifyFIFO runs `dlock verify --fifo` on redis://local: the workers
// acquire with dlock.WithFIFO(), the run passes, and the report marks its
// row "(FIFO)".
func TestVerifyFIFO(t *testing.T) {
	report := verifyPasses(t, "--fifo", "--backend", "redis://local", "--name", "redislock", "--faults", "none",
		"--duration", "2s", "--runs", "1", "--workers", "3", "--ttl", "200ms", "--out", t.TempDir())
	if !strings.Contains(report, "redislock (FIFO)") || !strings.Contains(report, "PASS") {
		t.Fatalf("got report\n%s\nwant a PASS row labelled \"redislock (FIFO)\"", report)
	}
}

// TestVerifyFIFORedlock: a Redlock has no server-side queue, so --fifo is
// bad input (exit status 2), not a run that fails every acquisition.
func TestVerifyFIFORedlock(t *testing.T) {
	_, stderr, err := verifyRun("--fifo", "--backend", "redlock://local", "--faults", "none",
		"--duration", "2s", "--runs", "1", "--workers", "2", "--ttl", "200ms", "--out", t.TempDir())
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("dlock verify --fifo on redlock: got %v, want exit status 2\nstderr:\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "cannot queue waiters") {
		t.Errorf("got stderr %q, want it to say the backend cannot queue waiters", stderr)
	}
}
