//go:build unix

package main_test

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestVerifyZooKeeperSession runs `dlock verify` on zk://local with holder
// pauses. The workers' ZooKeeper sessions must time out with the lease TTL:
// with a longer session a paused holder keeps its lock node for the whole
// pause, nobody takes the lock, and the run is INVALID (exit status 1).
func TestVerifyZooKeeperSession(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 10 s verification on ZooKeeper")
	}
	out := t.TempDir()
	cmd := exec.Command(bin, "verify", "--backend", "zk://local", "--faults", "pause", "--duration", "10s", "--runs", "1",
		"--workers", "3", "--ttl", "1s", "--out", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("dlock verify: got %v, want success\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "PASS") {
		t.Fatalf("got report without PASS, want the pause run passed:\n%s", stdout.String())
	}
}

// TestVerifyFIFO runs `dlock verify --fifo` on redis://local: the workers
// acquire with dlock.WithFIFO(), the run passes, and the report marks its
// row "(FIFO)".
func TestVerifyFIFO(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command(bin, "verify", "--fifo", "--backend", "redis://local", "--name", "redislock", "--faults", "none",
		"--duration", "2s", "--runs", "1", "--workers", "3", "--ttl", "200ms", "--out", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("dlock verify --fifo: got %v, want success\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "redislock (FIFO)") || !strings.Contains(stdout.String(), "PASS") {
		t.Fatalf("got report\n%s\nwant a PASS row labelled \"redislock (FIFO)\"", stdout.String())
	}
}

// TestVerifyFIFORedlock: a Redlock has no server-side queue, so --fifo is
// bad input (exit status 2), not a run that fails every acquisition.
func TestVerifyFIFORedlock(t *testing.T) {
	cmd := exec.Command(bin, "verify", "--fifo", "--backend", "redlock://local", "--faults", "none",
		"--duration", "2s", "--runs", "1", "--workers", "2", "--ttl", "200ms", "--out", t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("dlock verify --fifo on redlock: got %v, want exit status 2\nstderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "cannot queue waiters") {
		t.Errorf("got stderr %q, want it to say the backend cannot queue waiters", stderr.String())
	}
}
