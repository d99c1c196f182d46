//go:build unix

package main_test

import (
	"bytes"
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
