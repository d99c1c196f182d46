//go:build unix

package main_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// TestOtherBackends runs the CLI against etcd and ZooKeeper servers when
// they are installed.
func TestOtherBackends(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) string // returns the backend URL
	}{
		{"etcd", func(t *testing.T) string {
			e, err := testserver.StartEtcd(testserver.EtcdOptions{})
			skipIfMissing(t, err)
			t.Cleanup(func() { _ = e.Stop() })
			return "etcd://" + strings.Join(e.Endpoints(), ",")
		}},
		{"zk", func(t *testing.T) string {
			z, err := testserver.StartZooKeeper(testserver.ZooKeeperOptions{TickTime: 500 * time.Millisecond})
			skipIfMissing(t, err)
			t.Cleanup(func() { _ = z.Stop() })
			return "zk://" + z.Addr() + "/dlock-cli-test"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := tc.start(t)
			key := keyFor(t)
			with := func(args ...string) []string {
				return append([]string{"--backend", url}, args...)
			}

			r := dlockRun(t, with("run", "--ttl", "5s", key, "--", "sh", "-c", `echo "$DLOCK_BACKEND $DLOCK_FENCE"; exit 3`)...)
			if r.code == 1 && strings.Contains(r.stderr, "not available in this build") {
				t.Skip(strings.TrimSpace(r.stderr))
			}
			assertCode(t, r, 3)
			if fields := strings.Fields(r.stdout); len(fields) != 2 || fields[0] != url || fields[1] == "0" {
				t.Errorf("DLOCK_BACKEND and DLOCK_FENCE: got %q, want %q and a fence", r.stdout, url)
			}

			holder := startDlock(t, with("run", "--ttl", "5s", key, "--", "sh", "-c", trapScript)...)
			holder.await("ready")
			assertCode(t, dlockRun(t, with("run", "--ttl", "5s", key, "--", "true")...), 75)

			in := dlockRun(t, with("inspect", key)...)
			switch {
			case in.code == 1 && strings.Contains(in.stderr, "does not support inspect"):
				t.Logf("%s: %s", tc.name, strings.TrimSpace(in.stderr))
			case in.code == 0:
				if !regexpMatch(`(?m)^held\s+yes$`, in.stdout) {
					t.Errorf("inspect: got %q, want held yes", in.stdout)
				}
			default:
				t.Errorf("inspect: exit code %d, stderr %q", in.code, in.stderr)
			}

			if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			assertCode(t, holder.wait(10*time.Second), 5)
			// Released at once: the next run gets the lock without waiting.
			assertCode(t, dlockRun(t, with("run", "--ttl", "5s", key, "--", "true")...), 0)

			// A force release makes a running holder lose its lease.
			holder = startDlock(t, with("run", "--ttl", "5s", key, "--", "sh", "-c", trapScript)...)
			holder.await("ready")
			fr := dlockRun(t, with("release", "--force", key)...)
			if fr.code == 1 && strings.Contains(fr.stderr, "does not support force release") {
				t.Logf("%s: %s", tc.name, strings.TrimSpace(fr.stderr))
				return
			}
			assertCode(t, fr, 0)
			r = holder.wait(15 * time.Second)
			assertLost(t, r, fmt.Sprintf("lost the lock %q", key))
		})
	}
}

func skipIfMissing(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, testserver.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// redlockURL starts three redis-servers for the test alone and returns the
// redlock:// URL of the three.
func redlockURL(t *testing.T) string {
	t.Helper()
	nodes, err := testserver.StartRedisN(3, testserver.RedisOptions{})
	skipIfMissing(t, err)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		t.Cleanup(func() { _ = n.Stop() })
		addrs[i] = n.Addr()
	}
	return "redlock://" + strings.Join(addrs, ",")
}

// TestRedlockReleaseOwner: `release --owner` frees a Redlock lease that a
// `dlock run` without --owner holds (its nodes know it under a token derived
// from owner and fence), and the holder then loses its lease.
func TestRedlockReleaseOwner(t *testing.T) {
	t.Parallel()
	url := redlockURL(t)
	with := func(args ...string) []string { return on(url, args...) }
	key := keyFor(t)
	holder := startDlock(t, with("run", "--ttl", "5s", key, "--", "sh", "-c", trapScript)...)
	holder.await("ready")

	in := dlockRun(t, with("inspect", "--json", key)...)
	assertCode(t, in, 0)
	var info struct {
		Held  bool   `json:"held"`
		Owner string `json:"owner"`
	}
	if err := json.Unmarshal([]byte(in.stdout), &info); err != nil || !info.Held || info.Owner == "" {
		t.Fatalf("inspect --json: got %q (%v), want held with an owner", in.stdout, err)
	}
	if strings.Contains(info.Owner, "~") {
		t.Errorf("inspect: owner %q carries the node token's suffix, want the lease's token", info.Owner)
	}

	wrong := dlockRun(t, with("release", key, "--owner", info.Owner+"x")...)
	assertCode(t, wrong, 1)
	right := dlockRun(t, with("release", key, "--owner", info.Owner)...)
	assertCode(t, right, 0)
	assertLost(t, holder.wait(15*time.Second), fmt.Sprintf("lost the lock %q", key))
}
