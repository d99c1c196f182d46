//go:build unix

package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// TestKinds runs `dlock run --permits`, `run --shared`, `leader` and
// `inspect` of such keys against one ZooKeeper server (a backend with
// semaphores, read-write locks and leader election).
func TestKinds(t *testing.T) {
	t.Parallel()
	z, err := testserver.StartZooKeeper(testserver.ZooKeeperOptions{TickTime: 500 * time.Millisecond})
	skipIfMissing(t, err)
	t.Cleanup(func() { _ = z.Stop() })
	url := "zk://" + z.Addr() + "/dlock-cli-kinds"
	for name, test := range map[string]func(*testing.T, string){
		"RunPermits":      testRunPermits,
		"RunShared":       testRunShared,
		"LeaderRunShow":   testLeaderRunShow,
		"LeaderWatch":     testLeaderWatch,
		"LeaderLost":      testLeaderLost,
		"PermitsDisagree": testPermitsDisagree,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, url)
		})
	}
}

// on returns args with --backend url in front.
func on(url string, args ...string) []string {
	return append([]string{"--backend", url}, args...)
}

// counterScript is a command that registers itself in the directory $1
// as NAME.$$ (NAME is $2) while it runs, appends the number of other
// registered commands of each kind it sees to $1/saw ("NAME lock=N
// permit=N read=N"), prints "ready", waits until the file $1/go exists,
// looks again, and unregisters.
const counterScript = `d=$1; me=$d/$2.$$
count() { for k in lock permit read; do printf ' %s=%s' $k "$(ls "$d" | grep -c "^$k\.")"; done; }
touch "$me"; echo "$2$(count)" >> "$d/saw"
echo ready
while [ ! -e "$d/go" ]; do sleep 0.02; done
echo "$2$(count)" >> "$d/saw"
rm "$me"`

// counted returns the argv of a counterScript registering as name in dir.
func counted(dir, name string) []string {
	return []string{"sh", "-c", counterScript, "counter", dir, name}
}

// finishAll lets every counterScript in dir finish, asserts that each of
// procs exits 0, and returns the sightings of their commands (two lines
// each).
func finishAll(t *testing.T, dir string, procs ...*proc) []map[string]int {
	t.Helper()
	letGo(t, dir)
	for _, p := range procs {
		assertCode(t, p.wait(30*time.Second), 0)
	}
	seen := sightings(t, dir)
	if len(seen) != 2*len(procs) {
		t.Fatalf("saw: got %d lines, want %d (two per command)", len(seen), 2*len(procs))
	}
	return seen
}

// sightings parses dir/saw: for each line, the counts of registered
// commands seen by a command of kind name.
func sightings(t *testing.T, dir string) []map[string]int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "saw"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]int
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		m := map[string]int{}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("saw: bad line %q", line)
			}
			m[k] = n
		}
		m["kind:"+f[0]] = 1
		out = append(out, m)
	}
	return out
}

// letGo lets every counterScript in dir finish.
func letGo(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// inspectKey runs `dlock inspect --json key` on url and returns what it
// printed.
func inspectKey(t *testing.T, url, key string) inspectJSON {
	t.Helper()
	return decodeInfo(t, dlockRun(t, on(url, "inspect", "--json", key)...))
}

// testRunPermits: of three `run --permits 2` started together, two run
// at once and the third only after one of them exits; a fourth with
// --wait 0 is refused with 75; inspect lists the two permits.
func testRunPermits(t *testing.T, url string) {
	key := keyFor(t)
	dir := t.TempDir()
	run := func(args ...string) *proc {
		return startDlock(t, on(url, append([]string{"run", "--ttl", "5s", "--permits", "2", "--wait", "forever", key, "--"}, args...)...)...)
	}
	a, b := run(counted(dir, "permit")...), run(counted(dir, "permit")...)
	a.await("ready")
	b.await("ready")
	c := run(counted(dir, "permit")...)
	awaitStderr(t, c, "all 2 permits of \""+key+"\" are held: waiting")

	full := dlockRun(t, on(url, "run", "--ttl", "5s", "--permits", "2", key, "--", "true")...)
	assertCode(t, full, 75)
	assertContains(t, "run --permits 2 while both are held: stderr", full.stderr, `all 2 permits of "`+key+`" are held (2 of 2 permits held`)

	j := inspectKey(t, url, key)
	if !j.Held || j.Kind != "permit" || j.Permits != 2 || len(j.Holds) != 2 || j.Owner != "" {
		t.Errorf("inspect --json: got %+v, want kind permit, permits 2, 2 holds, no owner", j)
	}
	if len(j.Holds) == 2 && (j.Holds[0].Fence == 0 || j.Holds[0].Fence == j.Holds[1].Fence || j.Holds[0].Owner == j.Holds[1].Owner) {
		t.Errorf("inspect --json holds: got %+v, want two owners with distinct fences", j.Holds)
	}
	if j.Waiters != nil && *j.Waiters != 1 {
		t.Errorf("inspect --json: waiters %d, want 1 (the third run)", *j.Waiters)
	}
	text := dlockRun(t, on(url, "inspect", key)...)
	assertCode(t, text, 0)
	for _, re := range []string{`(?m)^kind\s+permit$`, `(?m)^permits\s+2$`, `(?m)^holds\s+2$`, `(?m)^hold\s+owner \S+, fence [0-9]+, ttl `} {
		if !regexpMatch(re, text.stdout) {
			t.Errorf("inspect output %q does not match %s", text.stdout, re)
		}
	}

	seen := finishAll(t, dir, a, b, c)
	most := 0
	for _, s := range seen {
		most = max(most, s["permit"])
	}
	if most != 2 {
		t.Errorf("commands running at once: at most %d seen, want 2 (never 3, and the two first together); %v", most, seen)
	}
	if j := inspectKey(t, url, key); j.Held {
		t.Errorf("after every run exited: inspect %+v, want free", j)
	}
}

// testRunShared: two `run --shared` run together; a plain run is refused
// while they hold, and one that waits runs only after both exited and
// keeps a new shared run out meanwhile.
func testRunShared(t *testing.T, url string) {
	key := keyFor(t)
	dir := t.TempDir()
	r1 := startDlock(t, on(url, append([]string{"run", "--ttl", "5s", "--shared", key, "--"}, counted(dir, "read")...)...)...)
	r2 := startDlock(t, on(url, append([]string{"run", "--ttl", "5s", "--shared", key, "--"}, counted(dir, "read")...)...)...)
	r1.await("ready")
	r2.await("ready")

	j := inspectKey(t, url, key)
	if !j.Held || j.Kind != "read" || len(j.Holds) != 2 || j.Permits != 0 {
		t.Errorf("inspect --json: got %+v, want kind read with 2 holds", j)
	}
	plain := dlockRun(t, on(url, "run", "--ttl", "5s", key, "--", "true")...)
	assertCode(t, plain, 75)

	w := startDlock(t, on(url, append([]string{"run", "--ttl", "5s", "--wait", "forever", key, "--"}, counted(dir, "lock")...)...)...)
	awaitWaiting(t, w)
	late := dlockRun(t, on(url, "run", "--ttl", "5s", "--shared", key, "--", "true")...)
	assertCode(t, late, 75)
	assertContains(t, "run --shared while a writer waits: stderr", late.stderr, "held by a writer, or a writer waits")

	seen := finishAll(t, dir, r1, r2, w)
	readersTogether := false
	for _, s := range seen {
		if s["kind:lock"] == 1 && s["read"] != 0 || s["kind:read"] == 1 && s["lock"] != 0 {
			t.Errorf("a shared run and a plain run overlapped: %v", seen)
		}
		if s["kind:read"] == 1 && s["read"] == 2 {
			readersTogether = true
		}
	}
	if !readersTogether {
		t.Errorf("the two shared runs never saw each other: %v", seen)
	}
}

// testPermitsDisagree: a run whose --permits differs from the holders' is
// a usage error naming both, and changes nothing.
func testPermitsDisagree(t *testing.T, url string) {
	key := keyFor(t)
	dir := t.TempDir()
	p := startDlock(t, on(url, append([]string{"run", "--ttl", "5s", "--permits", "2", key, "--"}, counted(dir, "permit")...)...)...)
	p.await("ready")
	r := dlockRun(t, on(url, "run", "--ttl", "5s", "--permits", "3", key, "--", "true")...)
	assertCode(t, r, 2)
	assertContains(t, "stderr", r.stderr, "--permits 3 disagrees", "2 permits")
	if j := inspectKey(t, url, key); j.Permits != 2 || len(j.Holds) != 1 {
		t.Errorf("after the refused run: inspect %+v, want 2 permits, 1 hold", j)
	}
	letGo(t, dir)
	assertCode(t, p.wait(30*time.Second), 0)
}

// TestKindsBadInput: flags that cannot go together, and kinds on a
// backend without them, are usage errors (exit 2) with a message naming
// the problem, before anything runs.
func TestKindsBadInput(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "ran")
	touch := "touch " + marker
	t.Cleanup(func() { // after the parallel subtests
		if _, err := os.Stat(marker); err == nil {
			t.Errorf("a refused run ran its command")
		}
	})
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"zero permits", []string{"run", "--permits", "0", "k", "--", "sh", "-c", touch}, "invalid --permits 0: must be at least 1"},
		{"negative permits", []string{"run", "--permits", "-2", "k", "--", "sh", "-c", touch}, "invalid --permits -2"},
		{"permits not a number", []string{"run", "--permits", "two", "k", "--", "sh", "-c", touch}, "--permits"},
		{"permits and shared", []string{"run", "--permits", "2", "--shared", "k", "--", "sh", "-c", touch}, "at most one of --permits and --shared"},
		{"permits and owner", []string{"run", "--permits", "2", "--owner", "o", "k", "--", "sh", "-c", touch}, "permits are not reentrant"},
		{"shared and owner", []string{"run", "--shared", "--owner", "o", "k", "--", "sh", "-c", touch}, "read holds are not reentrant"},
		{"leader run without command", []string{"leader", "run", "k"}, "leader run: missing -- COMMAND"},
		{"leader run without key", []string{"leader", "run"}, "leader run: missing KEY"},
		{"leader run owner", []string{"leader", "run", "--owner", "o", "k", "--", "sh", "-c", touch}, "unknown flag: --owner"},
		{"leader show without key", []string{"leader", "show"}, "leader show: want exactly one KEY"},
		{"leader watch two keys", []string{"leader", "watch", "a", "b"}, "leader watch: want exactly one KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := dlockRun(t, tc.args...)
			assertCode(t, r, 2)
			if !strings.HasPrefix(r.stderr, "dlock: ") || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr: got %q, want it to start with \"dlock: \" and contain %q", r.stderr, tc.want)
			}
		})
	}
}

// TestKindsUnsupported: on a backend without semaphores, read-write locks
// or leader election (Redlock), run --permits, run --shared and the
// leader commands exit 2 with a message saying so, without running the
// command.
func TestKindsUnsupported(t *testing.T) {
	t.Parallel()
	url := redlockURL(t)
	marker := filepath.Join(t.TempDir(), "ran")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--permits", "2", "k", "--", "touch", marker}, "run: the redlock backend does not support semaphores (--permits)"},
		{[]string{"run", "--shared", "k", "--", "touch", marker}, "run: the redlock backend does not support read-write locks (--shared)"},
		{[]string{"leader", "run", "k", "--", "touch", marker}, "leader run: the redlock backend does not support leader election"},
		{[]string{"leader", "show", "k"}, "leader show: the redlock backend does not support leader election"},
		{[]string{"leader", "watch", "k"}, "leader watch: the redlock backend does not support leader election"},
	} {
		r := dlockRun(t, on(url, tc.args...)...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "dlock: "+tc.want) {
			t.Errorf("dlock %v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, "dlock: "+tc.want)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("a refused run ran its command")
	}
}

// TestReleasePermitOwner: on Redis, `release --owner` frees exactly the
// owner's permit of a semaphore and refuses an owner without one;
// `release --force` removes every permit and says how many.
func TestReleasePermitOwner(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	c, _, _ := lockClient(t, srv.Addr(), dlock.WithTTL(time.Minute))
	sem := c.Semaphore(key, 2)
	mine, err := sem.TryAcquire(context.Background())
	if err != nil {
		t.Fatalf("Semaphore.TryAcquire: %v", err)
	}
	other, err := sem.TryAcquire(context.Background())
	if err != nil {
		t.Fatalf("Semaphore.TryAcquire: %v", err)
	}

	wrong := dlockRun(t, "release", key, "--owner", "nobody")
	assertCode(t, wrong, 1)
	assertContains(t, "release --owner nobody: stderr", wrong.stderr, `has no permit hold of owner "nobody": nothing released`)
	right := dlockRun(t, "release", key, "--owner", mine.Owner())
	assertCode(t, right, 0)
	assertContains(t, "release --owner: stdout", right.stdout, fmt.Sprintf("released the permit hold of owner %s on %q (fence %d)", mine.Owner(), key, mine.Fence()))
	info := inspect(t, key)
	if len(info.Holds) != 1 || info.Holds[0].Owner != other.Owner() {
		t.Fatalf("after releasing one permit: holds %+v, want only %q's", info.Holds, other.Owner())
	}
	force := dlockRun(t, "release", key, "--force")
	assertCode(t, force, 0)
	assertContains(t, "release --force: stdout", force.stdout, fmt.Sprintf("removed lock %q: 1 of 2 permits held: owner %s (fence %d)", key, other.Owner(), other.Fence()))
	assertFree(t, key)
}
