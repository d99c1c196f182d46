package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestQuickKinds runs K1, K2 and K3 in quick mode for dlock's redislock,
// the raw floor and etcd's election, and checks that the report has their
// tables, rows and target lines. It does not judge the figures.
func TestQuickKinds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and etcd and runs the benchmark for ~15 s; skipped with -short")
	}
	for _, bin := range []string{"redis-server", "etcd"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (scripts/install-servers.sh installs it)", bin)
		}
	}
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	var stderr bytes.Buffer
	err := run1([]string{"-quick", "-scenarios", "K1,K2,K3", "-backends", "floor,redislock,etcd-mutex", "-out", out}, io.Discard, &stderr)
	if err != nil {
		t.Fatalf("run1: got error %v, want nil; log:\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	for _, want := range []string{
		"## K1 — semaphore", "## K2 — readers", "## K3 — leader election",
		"| floor: raw sorted-set semaphore | Redis |", "| **dlock redislock** | Redis |",
		"| etcd concurrency.Election | etcd |",
		"| K1: dlock redislock semaphore ≥ 0.8× the raw sorted-set semaphore (ops/s) |",
		"| K2 (for information, no target): dlock redislock, 16 readers against the mutex |",
		"| K3: dlock redislock — a new leader within TTL + 100 ms of the leader's SIGKILL |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.Contains(md, "Failed runs") {
		t.Errorf("report has failed runs:\n%s", md)
	}
}
