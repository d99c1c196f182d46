package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestQuickKinds runs K1, K2 and K3 in quick mode for dlock's redislock,
// the raw floor and etcd's election, and checks that the report has their
// tables, rows and target lines. It does not judge the figures.
func TestQuickKinds(t *testing.T) {
	md, _ := quickRun(t, "starts redis-server and etcd and runs the benchmark for ~15 s", []string{"redis-server", "etcd"},
		filepath.Join(t.TempDir(), "BENCHMARKS.md"), "-scenarios", "K1,K2,K3", "-backends", "floor,redislock,etcd-mutex")
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
