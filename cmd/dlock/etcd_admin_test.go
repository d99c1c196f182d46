//go:build unix

package main_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// TestEtcdInspectAndForceRelease: on etcd, `inspect` shows the holder
// (owner, fence, count, TTL left) and the queued waiters, and `release
// --force` removes the holder, whose `dlock run` then reports the lease
// lost, and hands the lock to the waiter.
func TestEtcdInspectAndForceRelease(t *testing.T) {
	t.Parallel()
	e, err := testserver.StartEtcd(testserver.EtcdOptions{})
	skipIfMissing(t, err)
	t.Cleanup(func() { _ = e.Stop() })
	url := "etcd://" + strings.Join(e.Endpoints(), ",")
	with := func(args ...string) []string { return append([]string{"--backend", url}, args...) }
	key := keyFor(t)

	free := decodeInfo(t, dlockRun(t, with("inspect", "--json", key)...))
	if free.Held || free.Key != key || free.Owner != "" || free.Backend != "etcd" {
		t.Errorf("inspect --json of a free lock: got %+v, want held false, key %q, backend etcd", free, key)
	}

	holder := startDlock(t, with("run", "--owner", "job-1", "--ttl", "5s", key, "--", "sh", "-c", trapScript)...)
	holder.await("ready")
	held := decodeInfo(t, dlockRun(t, with("inspect", "--json", key)...))
	if !held.Held || held.Owner != "job-1" || held.Fence == 0 || held.Count != 1 || held.Waiters == nil || *held.Waiters != 0 {
		t.Errorf("inspect --json: got %+v, want held by job-1 with a fence, count 1, 0 waiters", held)
	}
	if held.TTLms <= 0 || held.TTLms > 5000 {
		t.Errorf("inspect --json: ttl_ms %d, want in (0, 5000]", held.TTLms)
	}
	text := dlockRun(t, with("inspect", key)...)
	assertCode(t, text, 0)
	for _, re := range []string{`(?m)^held\s+yes$`, `(?m)^owner\s+job-1$`, fmt.Sprintf(`(?m)^fence\s+%d$`, held.Fence), `(?m)^waiters\s+0$`} {
		if !regexpMatch(re, text.stdout) {
			t.Errorf("inspect output %q does not match %s", text.stdout, re)
		}
	}

	// A waiter queues behind the holder.
	waiter := startDlock(t, with("run", "--ttl", "5s", "--wait", "1m", key, "--", "sh", "-c", "echo got-lock")...)
	awaitWaiting(t, waiter)
	var j inspectJSON
	if !locktest.Poll(30*time.Second, func() bool {
		j = decodeInfo(t, dlockRun(t, with("inspect", "--json", key)...))
		return j.Waiters != nil && *j.Waiters == 1
	}) {
		t.Fatalf("inspect --json: got %+v, want 1 waiter within 30s", j)
	}

	fr := decodeInfo(t, dlockRun(t, with("release", "--force", "--json", key)...))
	if fr.Action == nil || *fr.Action != "removed" || !fr.Held || fr.Owner != "job-1" || fr.Fence != held.Fence {
		t.Errorf("release --force --json: got %+v, want removed, held by job-1 at fence %d", fr, held.Fence)
	}
	r := holder.wait(15 * time.Second)
	assertLost(t, r, fmt.Sprintf("lost the lock %q", key))
	w := waiter.wait(30 * time.Second)
	assertCode(t, w, 0)
	assertContains(t, "waiter: stdout", w.stdout, "got-lock")

	none := decodeInfo(t, dlockRun(t, with("release", "--force", "--json", key)...))
	if none.Held || none.Action == nil || *none.Action != "none" {
		t.Errorf("release --force --json of a free lock: got %+v, want held false, action none", none)
	}
}
