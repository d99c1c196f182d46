//go:build unix

package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// The tests run the built dlock binary against a real redis-server.
var (
	bin string            // the dlock binary, built by TestMain
	srv *testserver.Redis // shared server; every test uses its own keys
)

type testMain struct{ m *testing.M }

// Run builds the binary and starts the server around the tests, so that
// goleak checks after both are gone.
func (tm testMain) Run() int {
	dir, err := os.MkdirTemp("", "dlock-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "dlock")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building dlock:", err)
		return 1
	}
	srv, err = testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Stop()
	return tm.m.Run()
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(testMain{m}) }

// backendURL is the URL of the shared server.
func backendURL() string { return "redis://" + srv.Addr() }

// keyFor returns a key unique to the test.
func keyFor(t *testing.T) string {
	t.Helper()
	return "cli-test:" + t.Name()
}

type result struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

// command returns an *exec.Cmd running dlock with args against the shared
// server (DLOCK_BACKEND), unless args choose another with --backend.
func command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DLOCK_BACKEND="+backendURL())
	return cmd
}

// dlockRun runs dlock to completion (bounded by a minute) and returns what
// it printed and its exit code.
func dlockRun(t *testing.T, args ...string) result {
	t.Helper()
	cmd := command(t, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting dlock: %v", err)
	}
	return waitResult(t, cmd, &out, &errb, start, time.Minute)
}

func waitResult(t *testing.T, cmd *exec.Cmd, out, errb *bytes.Buffer, start time.Time, limit time.Duration) result {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("dlock %v: %v", cmd.Args[1:], err)
		}
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("dlock %v did not exit within %v; stderr: %s", cmd.Args[1:], limit, errb)
	}
	return result{stdout: out.String(), stderr: errb.String(), code: cmd.ProcessState.ExitCode(), took: time.Since(start)}
}

// proc is a dlock process running in the background whose stdout is read
// line by line.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string
	stdout *os.File // read end of dlock's stdout
	copied chan struct{}
	out    syncBuffer
	errb   syncBuffer
	start  time.Time
	res    *result
}

// syncBuffer is a bytes.Buffer safe for concurrent use whose readers can
// await the next Write.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed by the next Write; nil if nobody awaits it
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written != nil {
		close(s.written)
		s.written = nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// next returns what was written so far and a channel that the next Write
// closes.
func (s *syncBuffer) next() (string, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written == nil {
		s.written = make(chan struct{})
	}
	return s.b.String(), s.written
}

// startDlock starts dlock with args; the process is killed at the end of
// the test if it still runs.
func startDlock(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: command(t, args...), lines: make(chan string, 64), copied: make(chan struct{})}
	p.cmd.Stderr = &p.errb
	// An os.Pipe rather than StdoutPipe: the reader sees EOF once dlock and
	// its command have both closed it, and can be cut off (see wait) if a
	// command outlives dlock.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdout, p.cmd.Stdout = r, w
	p.start = time.Now()
	err = p.cmd.Start()
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		t.Fatalf("starting dlock: %v", err)
	}
	go func() {
		defer close(p.copied)
		defer close(p.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			_, _ = p.out.Write(append(sc.Bytes(), '\n'))
			select {
			case p.lines <- sc.Text():
			default: // nobody is awaiting lines any more
			}
		}
	}()
	// A test that ends early stops dlock with SIGTERM, which dlock forwards
	// to its command, so no command outlives the test; SIGKILL follows if
	// that takes too long. WaitDelay keeps Wait from hanging on a pipe
	// still held open by an orphaned command.
	p.cmd.WaitDelay = 5 * time.Second
	t.Cleanup(func() {
		if p.res == nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			timer := time.AfterFunc(10*time.Second, func() { _ = p.cmd.Process.Kill() })
			_ = p.cmd.Wait()
			timer.Stop()
		}
		p.drain()
	})
	return p
}

// await waits until the process prints a line containing s.
func (p *proc) await(s string) {
	p.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("dlock exited before printing %q; stdout %q, stderr %q", s, p.out.String(), p.errb.String())
			}
			if strings.Contains(line, s) {
				return
			}
		case <-timeout:
			p.t.Fatalf("dlock did not print %q within 30s; stderr %q", s, p.errb.String())
		}
	}
}

// drain waits for the rest of dlock's stdout, at most 5 s after dlock
// exited (a command that outlives dlock keeps the pipe open).
func (p *proc) drain() {
	select {
	case <-p.copied:
	case <-time.After(5 * time.Second):
		_ = p.stdout.Close()
		<-p.copied
	}
	_ = p.stdout.Close()
}

// wait waits up to limit for the process to exit.
func (p *proc) wait(limit time.Duration) result {
	p.t.Helper()
	done := make(chan error, 1)
	go func() {
		err := p.cmd.Wait()
		p.drain()
		done <- err
	}()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			p.t.Fatalf("dlock: %v", err)
		}
	case <-time.After(limit):
		_ = p.cmd.Process.Kill()
		<-done
		p.t.Fatalf("dlock did not exit within %v; stdout %q, stderr %q", limit, p.out.String(), p.errb.String())
	}
	p.res = &result{stdout: p.out.String(), stderr: p.errb.String(), code: p.cmd.ProcessState.ExitCode(), took: time.Since(p.start)}
	return *p.res
}

// lockClient returns a dlock Client on the shared server with its own
// connection, closed at the end of the test.
func lockClient(t *testing.T, addr string, opts ...dlock.Option) (*dlock.Client, *redislock.Backend, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b := redislock.New(rdb)
	c := dlock.New(b, opts...)
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		_ = rdb.Close()
	})
	return c, b, rdb
}

// hold takes key on the shared server from the test itself.
func hold(t *testing.T, key string, opts ...dlock.Option) *dlock.Lease {
	t.Helper()
	c, _, _ := lockClient(t, srv.Addr(), opts...)
	l, err := c.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", key, err)
	}
	return l
}

// inspectJSON is what `dlock inspect --json` and `release --json` print;
// the fields a backend or kind lacks stay zero.
type inspectJSON struct {
	Key     string `json:"key"`
	Held    bool   `json:"held"`
	Kind    string `json:"kind"`
	Owner   string `json:"owner"`
	Fence   uint64 `json:"fence"`
	Value   string `json:"value"`
	TTLms   int64  `json:"ttl_ms"`
	Count   int    `json:"count"`
	Permits int    `json:"permits"`
	Holds   []struct {
		Owner string `json:"owner"`
		Fence uint64 `json:"fence"`
	} `json:"holds"`
	Waiters *int    `json:"waiters"`
	Backend string  `json:"backend"`
	Action  *string `json:"action"`
}

// decodeInfo asserts that dlock exited 0 and decodes the JSON it printed.
func decodeInfo(t *testing.T, r result) inspectJSON {
	t.Helper()
	assertCode(t, r, 0)
	var j inspectJSON
	if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
		t.Fatalf("--json: %v in %q", err, r.stdout)
	}
	return j
}

// ownRedis starts a redis-server for the test alone, stopped when the test
// ends.
func ownRedis(t *testing.T) *testserver.Redis {
	t.Helper()
	own, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Stop() })
	return own
}

// inspect reads key's state on the shared server.
func inspect(t *testing.T, key string) dlock.Info {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	b := redislock.New(rdb)
	defer b.Close()
	info, err := b.Inspect(context.Background(), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return info
}

func assertFree(t *testing.T, key string) {
	t.Helper()
	if info := inspect(t, key); info.Held {
		t.Errorf("lock %q after dlock exited: held by %q, want free", key, info.Owner)
	}
}

func assertCode(t *testing.T, r result, want int) {
	t.Helper()
	if r.code != want {
		t.Fatalf("exit code: got %d, want %d; stdout %q, stderr %q", r.code, want, r.stdout, r.stderr)
	}
}

// assertStdout asserts that dlock exited 0 having printed want.
func assertStdout(t *testing.T, r result, want string) {
	t.Helper()
	assertCode(t, r, 0)
	if r.stdout != want {
		t.Errorf("stdout: got %q, want %q", r.stdout, want)
	}
}

// assertLost asserts that dlock exited with the lost code (76) after
// stopping its trapScript command with SIGTERM, and that its stderr says
// lost (what it lost, e.g. `lost the lock "K"`).
func assertLost(t *testing.T, r result, lost string) {
	t.Helper()
	assertCode(t, r, 76)
	assertContains(t, "child output", r.stdout, "got-TERM")
	assertContains(t, "stderr", r.stderr, lost)
}

// assertContains fails t unless out, named what in the message, contains
// each of want.
func assertContains(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: got %q, want %q in it", what, out, w)
		}
	}
}

// awaitWaiting waits until the dlock process p says on stderr that it
// waits for the lock (its Client began waiting after a failed attempt).
func awaitWaiting(t *testing.T, p *proc) {
	t.Helper()
	awaitStderr(t, p, "is held by another owner: waiting")
}

// awaitStderr waits until the dlock process p prints s on stderr, failing
// the test if that takes 30 s.
func awaitStderr(t *testing.T, p *proc, s string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		text, written := p.errb.next()
		if strings.Contains(text, s) {
			return
		}
		select {
		case <-written:
		case <-timeout:
			t.Fatalf("dlock did not print %q on stderr within 30s; stderr %q", s, p.errb.String())
		}
	}
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return port
}

// trapScript is a child that reports the signals it gets on stdout and
// exits with 5 on TERM, INT or HUP.
const trapScript = `trap 'echo got-TERM; exit 5' TERM; trap 'echo got-INT; exit 5' INT; trap 'echo got-HUP; exit 5' HUP; echo ready; while :; do sleep 0.05; done`

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	noexec := filepath.Join(t.TempDir(), "not-executable")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cmd  []string
		want int
	}{
		{"success", []string{"true"}, 0},
		{"failure", []string{"sh", "-c", "exit 3"}, 3},
		{"high code", []string{"sh", "-c", "exit 200"}, 200},
		{"killed by signal", []string{"sh", "-c", "kill -KILL $$"}, 128 + int(syscall.SIGKILL)},
		{"not found", []string{"no-such-command-dlock-test"}, 127},
		{"not executable", []string{noexec}, 126},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := keyFor(t)
			r := dlockRun(t, append([]string{"run", key, "--"}, tc.cmd...)...)
			assertCode(t, r, tc.want)
			assertFree(t, key)
		})
	}
}

func TestRunEnvironment(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	// The command inspects its own lock through DLOCK_BACKEND.
	script := `echo "key=$DLOCK_KEY"; echo "fence=$DLOCK_FENCE"; echo "owner=$DLOCK_OWNER"; "$0" inspect --json "$DLOCK_KEY"`
	r := dlockRun(t, "run", key, "--", "sh", "-c", script, bin)
	assertCode(t, r, 0)
	lines := strings.SplitN(r.stdout, "\n", 4)
	if len(lines) < 4 {
		t.Fatalf("child output: got %q, want 3 variables and JSON", r.stdout)
	}
	if got, want := lines[0], "key="+key; got != want {
		t.Errorf("DLOCK_KEY: got %q, want %q", got, want)
	}
	var info struct {
		Held  bool   `json:"held"`
		Owner string `json:"owner"`
		Fence uint64 `json:"fence"`
	}
	if err := json.Unmarshal([]byte(lines[3]), &info); err != nil {
		t.Fatalf("inspect --json from the child: %v in %q", err, lines[3])
	}
	if !info.Held {
		t.Fatalf("inspect from the child: lock not held")
	}
	if got, want := lines[1], fmt.Sprintf("fence=%d", info.Fence); got != want || info.Fence == 0 {
		t.Errorf("DLOCK_FENCE: got %q, want %q", got, want)
	}
	if got, want := lines[2], "owner="+info.Owner; got != want || info.Owner == "" {
		t.Errorf("DLOCK_OWNER: got %q, want %q", got, want)
	}
	assertFree(t, key)
}

// TestRunShortWaitFreeLock: a --wait shorter than a round trip still
// makes one attempt: a free lock is taken, not reported held.
func TestRunShortWaitFreeLock(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	for _, wait := range []string{"1ns", "100us"} {
		r := dlockRun(t, "run", "--wait", wait, key, "--", "true")
		assertCode(t, r, 0)
		assertFree(t, key)
	}
}

func TestRunConflict(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	l := hold(t, key)
	marker := filepath.Join(t.TempDir(), "ran")
	touch := []string{"sh", "-c", "touch " + marker}

	r := dlockRun(t, append([]string{"run", key, "--"}, touch...)...)
	assertCode(t, r, 75)
	assertContains(t, "stderr", r.stderr, fmt.Sprintf("lock %q is held by another owner", key), l.Owner())
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the command ran although the lock was held")
	}

	r = dlockRun(t, append([]string{"run", "--conflict-exit-code", "9", "--quiet", key, "--"}, touch...)...)
	assertCode(t, r, 9)
	if r.stderr != "" {
		t.Errorf("stderr with --quiet: got %q, want nothing", r.stderr)
	}

	const wait = 300 * time.Millisecond
	r = dlockRun(t, append([]string{"run", "--wait", wait.String(), key, "--"}, touch...)...)
	assertCode(t, r, 75)
	if r.took < wait {
		t.Errorf("--wait %v: gave up after %v, want at least %v", wait, r.took, wait)
	}
	assertContains(t, "stderr", r.stderr, "--wait")
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the command ran although the lock was held")
	}
	if info := inspect(t, key); info.Owner != l.Owner() {
		t.Errorf("holder after the conflicts: got %q, want %q", info.Owner, l.Owner())
	}
}

func TestRunWaitsForRelease(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	l := hold(t, key)
	p := startDlock(t, "run", "--wait", "30s", key, "--", "echo", "ran")
	awaitWaiting(t, p)
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := p.wait(30 * time.Second)
	assertStdout(t, r, "ran\n")
	assertFree(t, key)
}

func TestRunFIFO(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	l := hold(t, key)
	order := filepath.Join(t.TempDir(), "order")
	var procs []*proc
	for i := 1; i <= 3; i++ {
		p := startDlock(t, "run", "--fifo", "--wait", "30s", key, "--", "sh", "-c", fmt.Sprintf(`echo %d >> "$0"`, i), order)
		procs = append(procs, p)
		// Queue them one after the other.
		locktest.WaitFor(t, 30*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return inspect(t, key).Waiters >= i })
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		assertCode(t, p.wait(30*time.Second), 0)
	}
	b, err := os.ReadFile(order)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "1\n2\n3\n"; got != want {
		t.Errorf("order of the queued runs: got %q, want %q", got, want)
	}
	assertFree(t, key)
}

func TestRunInterruptedWhileWaiting(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	l := hold(t, key)
	p := startDlock(t, "run", "--wait", "forever", key, "--", "echo", "ran")
	awaitWaiting(t, p)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := p.wait(10 * time.Second)
	assertCode(t, r, 128+int(syscall.SIGINT))
	if r.stdout != "" || !strings.Contains(r.stderr, "interrupted") {
		t.Errorf("got stdout %q, stderr %q; want no output from the command and an interruption message", r.stdout, r.stderr)
	}
	if info := inspect(t, key); info.Owner != l.Owner() {
		t.Errorf("holder: got %q, want %q", info.Owner, l.Owner())
	}
}

func TestRunSignalsForwarded(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			key := keyFor(t)
			p := startDlock(t, "run", key, "--", "sh", "-c", trapScript)
			p.await("ready")
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			r := p.wait(10 * time.Second)
			assertCode(t, r, 5)
			name := map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGINT: "INT", syscall.SIGHUP: "HUP"}[sig]
			assertContains(t, "child output", r.stdout, "got-"+name)
			assertFree(t, key)
		})
	}
}

func TestRunSignalKillsUntrappingChild(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	p := startDlock(t, "run", key, "--", "sh", "-c", "echo ready; exec sleep 60")
	p.await("ready")
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := p.wait(10 * time.Second)
	assertCode(t, r, 128+int(syscall.SIGTERM))
	assertFree(t, key)
}

// The lease is lost when someone force-releases the lock: the watchdog's
// next renewal finds it gone.
func TestRunLostLeaseForceReleased(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	p := startDlock(t, "run", "--ttl", "1s", "--grace", "5s", key, "--", "sh", "-c", trapScript)
	p.await("ready")
	rel := dlockRun(t, "release", "--force", key)
	assertCode(t, rel, 0)
	r := p.wait(10 * time.Second)
	assertLost(t, r, fmt.Sprintf("lost the lock %q", key))
	if strings.Contains(r.stderr, "SIGKILL\n") {
		t.Errorf("stderr: got %q, want no SIGKILL (the child exits on SIGTERM)", r.stderr)
	}
}

func TestRunLostLeaseCustomCodeAndGrace(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	// The child ignores SIGTERM: SIGKILL follows after --grace.
	p := startDlock(t, "run", "--ttl", "1s", "--grace", "300ms", "--lost-exit-code", "99", key, "--",
		"sh", "-c", `trap '' TERM; echo ready; while :; do sleep 0.05; done`)
	p.await("ready")
	assertCode(t, dlockRun(t, "release", "--force", key), 0)
	r := p.wait(10 * time.Second)
	assertCode(t, r, 99)
	assertContains(t, "stderr", r.stderr, "sending SIGKILL")
}

// A loss the watchdog has not noticed yet (long TTL) is found when dlock
// releases the lock after the command: exit with the lost code anyway.
func TestRunLostFoundAtRelease(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	marker := filepath.Join(t.TempDir(), "go")
	p := startDlock(t, "run", "--ttl", "1m", key, "--", "sh", "-c",
		`echo ready; while [ ! -f "$0" ]; do sleep 0.02; done`, marker)
	p.await("ready")
	assertCode(t, dlockRun(t, "release", "--force", key), 0)
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := p.wait(10 * time.Second)
	assertCode(t, r, 76)
	assertContains(t, "stderr", r.stderr, fmt.Sprintf("the lock %q was lost before the command finished", key))
}

// If dlock itself dies, nobody renews the lease: on Linux the command is
// killed with it rather than run on unprotected.
func TestRunCommandDiesWithDlock(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("parent-death signal is Linux only")
	}
	t.Parallel()
	key := keyFor(t)
	p := startDlock(t, "run", key, "--", "sh", "-c", `echo "ready $$"; while :; do sleep 0.05; done`)
	var pid int
	for line := range p.lines {
		if _, err := fmt.Sscanf(line, "ready %d", &pid); err == nil {
			break
		}
	}
	if pid == 0 {
		t.Fatalf("the command did not report its pid; stderr %q", p.errb.String())
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(10 * time.Second)
	if !locktest.Poll(10*time.Second, func() bool { return !alive(pid) }) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the command (pid %d) still runs 10s after dlock was killed", pid)
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestRunLostLeaseServerFault: a lease is lost when its server stops
// answering for longer than the TTL; the child is stopped and dlock exits
// with the lost code.
//   - stopped: the server is killed; dlock stops the command within a few
//     TTLs.
//   - frozen: a lease lost to a frozen server is not released on that
//     server: dlock stops the command and exits at once instead of waiting
//     up to --timeout for a server that does not answer. With --timeout 1m,
//     a dlock that waited would still run when the test gives up (the
//     server stays frozen until dlock exits).
func TestRunLostLeaseServerFault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		timeout string
		fault   func(t *testing.T, own *testserver.Redis) error
		limit   time.Duration // for dlock to exit
		within  time.Duration // for dlock to stop the command; 0: no bound
	}{
		{name: "stopped", timeout: "500ms", fault: func(_ *testing.T, own *testserver.Redis) error { return own.Kill() },
			limit: 15 * time.Second, within: 5 * time.Second},
		{name: "frozen", timeout: "1m", fault: func(t *testing.T, own *testserver.Redis) error {
			t.Cleanup(func() { _ = own.Resume() })
			return own.Pause()
		}, limit: 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			own := ownRedis(t)
			key := keyFor(t)
			p := startDlock(t, "--backend", "redis://"+own.Addr(), "--timeout", tc.timeout,
				"run", "--ttl", "1s", key, "--", "sh", "-c", trapScript)
			p.await("ready")
			if err := tc.fault(t, own); err != nil {
				t.Fatal(err)
			}
			faulted := time.Now()
			r := p.wait(tc.limit)
			assertLost(t, r, fmt.Sprintf("lost the lock %q", key))
			if took := time.Since(faulted); tc.within != 0 && took > tc.within {
				t.Errorf("dlock stopped the command %v after the server died, want within a few TTLs (1s)", took)
			}
		})
	}
}

func TestRunReentrantOwner(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	// A nested run with the same owner re-enters instead of conflicting.
	r := dlockRun(t, "run", "--owner", "job-1", key, "--", bin, "run", "--owner", "job-1", key, "--", "sh", "-c", `echo "$DLOCK_OWNER"`)
	assertStdout(t, r, "job-1\n")
	assertFree(t, key)
}

func TestInspect(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	free := dlockRun(t, "inspect", key)
	assertCode(t, free, 0)
	if !regexpMatch(`(?m)^held\s+no$`, free.stdout) || strings.Contains(free.stdout, "owner") {
		t.Errorf("inspect of a free lock: got %q, want held no and no owner", free.stdout)
	}
	freeJSON := dlockRun(t, "inspect", "--json", key)
	assertCode(t, freeJSON, 0)
	var fj map[string]any
	if err := json.Unmarshal([]byte(freeJSON.stdout), &fj); err != nil {
		t.Fatalf("inspect --json: %v in %q", err, freeJSON.stdout)
	}
	if fj["held"] != false || fj["key"] != key || fj["owner"] != nil {
		t.Errorf("inspect --json of a free lock: got %v, want held false, key %q, no owner", fj, key)
	}

	l := hold(t, key, dlock.WithTTL(time.Minute))
	held := dlockRun(t, "inspect", key)
	assertCode(t, held, 0)
	for _, re := range []string{
		`(?m)^key\s+` + regexpQuote(key) + `$`,
		`(?m)^held\s+yes$`,
		`(?m)^owner\s+` + l.Owner() + `$`,
		fmt.Sprintf(`(?m)^fence\s+%d$`, l.Fence()),
		`(?m)^ttl\s+[0-9.]+m?s$`,
		`(?m)^count\s+1$`,
		`(?m)^waiters\s+(unknown|[0-9]+)$`,
	} {
		if !regexpMatch(re, held.stdout) {
			t.Errorf("inspect output %q does not match %s", held.stdout, re)
		}
	}
	hj := decodeInfo(t, dlockRun(t, "inspect", "--json", key))
	if !hj.Held || hj.Key != key || hj.Owner != l.Owner() || hj.Fence != l.Fence() || hj.Count != 1 || hj.Backend != "redis" {
		t.Errorf("inspect --json: got %+v, want held by %q with fence %d, count 1, backend redis", hj, l.Owner(), l.Fence())
	}
	if hj.Waiters != nil && *hj.Waiters != 0 {
		t.Errorf("inspect --json: waiters %d, want 0 or null (unknown)", *hj.Waiters)
	}
	if hj.TTLms <= 0 || hj.TTLms > time.Minute.Milliseconds() {
		t.Errorf("ttl_ms: got %d, want in (0, 60000]", hj.TTLms)
	}
}

func TestReleaseOwner(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	l := hold(t, key)

	wrong := dlockRun(t, "release", key, "--owner", "someone-else")
	assertCode(t, wrong, 1)
	assertContains(t, "stderr", wrong.stderr, l.Owner(), "nothing released")
	if info := inspect(t, key); info.Owner != l.Owner() {
		t.Fatalf("after a release by the wrong owner: holder %q, want %q (intact)", info.Owner, l.Owner())
	}
	if l.Err() != nil {
		t.Fatalf("lease after a refused release: %v, want held", l.Err())
	}

	right := dlockRun(t, "release", key, "--owner", l.Owner())
	assertCode(t, right, 0)
	assertContains(t, "stdout", right.stdout, "released lock", l.Owner())
	assertFree(t, key)

	again := dlockRun(t, "release", key, "--owner", l.Owner())
	assertCode(t, again, 1)
	assertContains(t, "stderr", again.stderr, "not held")
}

func TestReleaseForce(t *testing.T) {
	t.Parallel()
	key := keyFor(t)
	l := hold(t, key, dlock.WithTTL(time.Second))
	r := dlockRun(t, "release", key, "--force")
	assertCode(t, r, 0)
	assertContains(t, "stdout", r.stdout, fmt.Sprintf("removed lock %q: owner %s, fence %d", key, l.Owner(), l.Fence()))
	assertFree(t, key)
	// The holder finds out at its next renewal.
	select {
	case <-l.Done():
		if !errors.Is(l.Err(), dlock.ErrLost) {
			t.Errorf("holder's lease: got %v, want ErrLost", l.Err())
		}
	case <-time.After(5 * time.Second):
		t.Errorf("holder's lease still held 5s after the force release")
	}

	none := dlockRun(t, "release", key, "--force", "--json")
	assertCode(t, none, 0)
	var j map[string]any
	if err := json.Unmarshal([]byte(none.stdout), &j); err != nil {
		t.Fatalf("release --json: %v in %q", err, none.stdout)
	}
	if j["held"] != false || j["action"] != "none" {
		t.Errorf("release --force --json of a free lock: got %v, want held false, action none", j)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"run without args", []string{"run"}, "missing KEY"},
		{"run without --", []string{"run", "k", "true"}, "missing --"},
		{"run without command", []string{"run", "k", "--"}, "missing COMMAND"},
		{"run key only", []string{"run", "k"}, "missing -- COMMAND"},
		{"run without key", []string{"run", "--", "true"}, "missing KEY"},
		{"run two keys", []string{"run", "a", "b", "--", "true"}, "one KEY"},
		{"invalid ttl", []string{"run", "--ttl", "soon", "k", "--", "true"}, "--ttl"},
		{"zero ttl", []string{"run", "--ttl", "0s", "k", "--", "true"}, "--ttl"},
		{"negative wait", []string{"run", "--wait", "-1s", "k", "--", "true"}, "--wait"},
		{"invalid wait", []string{"run", "--wait", "later", "k", "--", "true"}, "--wait"},
		{"negative grace", []string{"run", "--grace", "-1s", "k", "--", "true"}, "--grace"},
		{"invalid timeout", []string{"--timeout", "0s", "inspect", "k"}, "--timeout"},
		{"exit code out of range", []string{"run", "--conflict-exit-code", "300", "k", "--", "true"}, "--conflict-exit-code"},
		{"unknown flag", []string{"run", "--frobnicate", "k", "--", "true"}, "frobnicate"},
		{"unknown command", []string{"frobnicate"}, "frobnicate"},
		{"inspect without key", []string{"inspect"}, "KEY"},
		{"release neither", []string{"release", "k"}, "--owner"},
		{"release both", []string{"release", "k", "--owner", "o", "--force"}, "--owner"},
		{"unknown scheme", []string{"--backend", "mongodb://h:1", "inspect", "k"}, `unknown scheme "mongodb"`},
		{"no scheme", []string{"--backend", "127.0.0.1:6379", "inspect", "k"}, "SCHEME://"},
		{"empty host list", []string{"--backend", "redis+cluster://", "inspect", "k"}, "no host"},
		{"empty host in list", []string{"--backend", "redlock://a:1,,c:3", "inspect", "k"}, "empty host"},
		{"bad port", []string{"--backend", "redis://h:99999", "inspect", "k"}, "port"},
		{"port not a number", []string{"--backend", "etcd://a:1,b:x", "inspect", "k"}, `malformed host "b:x"`},
		{"two hosts for redis", []string{"--backend", "redis://a:1,b:2", "inspect", "k"}, "one host"},
		{"bad db", []string{"--backend", "redis://a:1/x", "inspect", "k"}, "database"},
		{"sentinel without master", []string{"--backend", "redis+sentinel://a:1,b:2", "inspect", "k"}, "master"},
		{"redis query", []string{"--backend", "redis://a:1?foo=bar", "inspect", "k"}, "query"},
		{"redlock even", []string{"--backend", "redlock://a,b,c,d", "inspect", "k"}, "odd number"},
		{"redlock one node", []string{"--backend", "redlock://a", "inspect", "k"}, "odd number"},
		{"redlock duplicate", []string{"--backend", "redlock://a,b,a:6379", "inspect", "k"}, "twice"},
		{"redlock node timeout", []string{"--backend", "redlock://a,b,c?node_timeout=fast", "inspect", "k"}, "node_timeout"},
		{"verify unknown fault", []string{"verify", "--faults", "bogus"}, `unknown fault "bogus"`},
		{"verify zero workers", []string{"verify", "--workers", "0"}, "workers"},
		{"verify unreachable backend", []string{"--backend", "redis://127.0.0.1:1", "--timeout", "1s", "verify", "--duration", "4s", "--ttl", "200ms"}, "127.0.0.1:1"},
		{"bad backend via env", nil, `unknown scheme "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var r result
			if tc.args == nil {
				cmd := exec.Command(bin, "inspect", "k")
				cmd.Env = append(os.Environ(), "DLOCK_BACKEND=nope://x")
				var out, errb bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &errb
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				r = waitResult(t, cmd, &out, &errb, time.Now(), time.Minute)
			} else {
				r = dlockRun(t, tc.args...)
			}
			assertCode(t, r, 2)
			if !strings.Contains(r.stderr, tc.want) || !strings.HasPrefix(r.stderr, "dlock: ") {
				t.Errorf("stderr: got %q, want it to start with \"dlock: \" and contain %q", r.stderr, tc.want)
			}
			if r.took > 5*time.Second {
				t.Errorf("took %v, want a prompt usage error", r.took)
			}
		})
	}
}

func TestPasswordRedacted(t *testing.T) {
	t.Parallel()
	r := dlockRun(t, "--backend", "redis://user:s3cret@h:1,x:2", "inspect", "k")
	assertCode(t, r, 2)
	if strings.Contains(r.stderr, "s3cret") {
		t.Errorf("stderr shows the password: %q", r.stderr)
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	port, port2, port3 := freePort(t), freePort(t), freePort(t)
	for _, tc := range []struct {
		name string
		url  string
	}{
		{"redis", fmt.Sprintf("redis://127.0.0.1:%d", port)},
		{"sentinel", fmt.Sprintf("redis+sentinel://127.0.0.1:%d/mymaster", port)},
		{"cluster", fmt.Sprintf("redis+cluster://127.0.0.1:%d", port)},
		{"redlock", fmt.Sprintf("redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", port, port2, port3)},
		{"etcd", fmt.Sprintf("etcd://127.0.0.1:%d", port)},
		{"zk", fmt.Sprintf("zk://127.0.0.1:%d", port)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{
				{"run", "k", "--", "true"},
				{"inspect", "k"},
				{"release", "k", "--force"},
			} {
				r := dlockRun(t, append([]string{"--backend", tc.url, "--timeout", "1s"}, args...)...)
				if r.code == 1 && strings.Contains(r.stderr, "not available in this build") {
					t.Skipf("%s: %s", tc.name, strings.TrimSpace(r.stderr))
				}
				assertCode(t, r, 2)
				assertContains(t, fmt.Sprintf("%v: stderr", args), r.stderr, fmt.Sprint(port))
				if r.took > 4*time.Second {
					t.Errorf("%v: took %v with --timeout 1s", args, r.took)
				}
			}
		})
	}
}

// A server that answers with an error was reached: dlock reports its
// answer (here: a database the server does not have), not "cannot reach".
func TestServerRefuses(t *testing.T) {
	t.Parallel()
	a := srv.Addr()
	_, port, _ := net.SplitHostPort(a)
	nodes := fmt.Sprintf("%s,localhost:%s,127.0.0.1:%d", a, port, freePort(t)) // two answer, one is down
	for _, url := range []string{"redis://" + a + "/99", "redlock://" + nodes + "/99"} {
		for _, args := range [][]string{
			{"run", "k", "--", "true"},
			{"inspect", "k"},
			{"release", "k", "--force"},
		} {
			r := dlockRun(t, append([]string{"--backend", url, "--timeout", "5s"}, args...)...)
			assertCode(t, r, 2)
			assertContains(t, fmt.Sprintf("%s %v: stderr", url, args), r.stderr, "answered with an error", "ERR DB index is out of range")
			if strings.Contains(r.stderr, "cannot reach") {
				t.Errorf("%s %v: stderr %q says the server was not reached", url, args, r.stderr)
			}
		}
	}
}

func TestServerNotAnswering(t *testing.T) {
	t.Parallel()
	own := ownRedis(t)
	if err := own.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Resume() })
	for _, args := range [][]string{
		{"run", "k", "--", "true"},
		{"run", "--wait", "10s", "k", "--", "true"},
		{"inspect", "k"},
	} {
		r := dlockRun(t, append([]string{"--backend", "redis://" + own.Addr(), "--timeout", "500ms"}, args...)...)
		assertCode(t, r, 2)
		assertContains(t, fmt.Sprintf("%v: stderr", args), r.stderr, "did not answer within 500ms")
		if r.took > 3*time.Second {
			t.Errorf("%v: took %v with --timeout 500ms", args, r.took)
		}
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	r := dlockRun(t, "--help")
	assertCode(t, r, 0)
	for _, want := range []string{"dlock run", "redis+sentinel://", "redlock://", "zk://", "Exit codes", "75", "76"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlock --help does not mention %q", want)
		}
	}
	r = dlockRun(t, "run", "--help")
	assertCode(t, r, 0)
	for _, want := range []string{"DLOCK_FENCE", "--conflict-exit-code", "--lost-exit-code", "--grace", "crontab"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlock run --help does not mention %q", want)
		}
	}
}

func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes tens of seconds")
	}
	t.Parallel()
	cmd := exec.Command(bin, "demo", "--json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := waitResult(t, cmd, &out, &errb, time.Now(), 3*time.Minute)
	var rep struct {
		OK    bool `json:"ok"`
		Parts []struct {
			ID      string         `json:"id"`
			Status  string         `json:"status"`
			Summary string         `json:"summary"`
			Details []string       `json:"details"`
			Facts   map[string]any `json:"facts"`
			Rows    []struct {
				Backend  string `json:"backend"`
				Handoffs int64  `json:"handoffs"`
				Overlaps int64  `json:"overlaps"`
				Skipped  string `json:"skipped"`
			} `json:"backends"`
		} `json:"parts"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("demo --json: %v; stdout %q, stderr %q", err, r.stdout, r.stderr)
	}
	assertCode(t, r, 0)
	if !rep.OK || len(rep.Parts) != 5 {
		t.Fatalf("demo report: ok %v with %d parts, want ok with 5", rep.OK, len(rep.Parts))
	}
	for i, p := range rep.Parts {
		if want := string(rune('a' + i)); p.ID != want {
			t.Errorf("part %d: got id %q, want %q", i, p.ID, want)
		}
		mustRun := p.ID == "a" || p.ID == "b" || p.ID == "c" || p.ID == "e"
		if p.Status != "PASS" && (mustRun || p.Status != "SKIP") {
			t.Errorf("part (%s): %s: %s %v", p.ID, p.Status, p.Summary, p.Details)
		}
	}
	a := rep.Parts[0].Facts
	if a["dlock_orders"] != float64(100) || a["dlock_stock_left"] != float64(0) {
		t.Errorf("part (a) with dlock: orders %v, stock %v; want 100 and 0", a["dlock_orders"], a["dlock_stock_left"])
	}
	if n, _ := a["nolock_orders"].(float64); n <= 100 {
		t.Errorf("part (a) without a lock: %v orders, want more than 100 (oversold)", a["nolock_orders"])
	}
	b := rep.Parts[1].Facts
	if b["fenced_rejected"] != true {
		t.Errorf("part (b): the fenced store did not reject the stale write: %v", b)
	}
	ran := map[string]bool{}
	for _, row := range rep.Parts[4].Rows {
		if row.Skipped == "" {
			ran[row.Backend] = true
			if row.Overlaps != 0 || row.Handoffs == 0 {
				t.Errorf("part (e) %s: %d overlaps, %d hand-offs; want 0 and > 0", row.Backend, row.Overlaps, row.Handoffs)
			}
		}
	}
	if !ran["memlock"] || !ran["redis"] {
		t.Errorf("part (e) ran %v, want at least memlock and redis", ran)
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

func regexpQuote(s string) string { return regexp.QuoteMeta(s) }

// TestMetricsAddr scrapes --metrics-addr of a running `dlock run` and
// finds the documented metric names.
func TestMetricsAddr(t *testing.T) {
	key := "metrics:" + t.Name()
	cmd := exec.Command(bin, "--backend", "redis://"+srv.Addr(), "run", "--metrics-addr", "127.0.0.1:0", "--ttl", "900ms", key, "--", "sleep", "2")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the metrics address: %v", err)
	}
	const prefix = "dlock: metrics on "
	if !strings.HasPrefix(line, prefix) {
		t.Fatalf("first stderr line: got %q, want %q…", line, prefix)
	}
	url := strings.TrimSpace(strings.TrimPrefix(line, prefix))
	// The lease is renewed every TTL/3: scrape once a renewal happened.
	var body string
	renewed := locktest.Poll(10*time.Second, func() bool {
		var resp *http.Response
		if resp, err = http.Get(url); err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return strings.Contains(body, `dlock_renewals_total{dlock_backend="redis"`) && !strings.Contains(body, `dlock_renewals_total{dlock_backend="redis"} 0`)
	})
	if !renewed {
		t.Fatalf("no renewal in the scraped metrics within 10s (err %v):\n%s", err, body)
	}
	for _, name := range []string{
		`dlock_acquisitions_total{dlock_backend="redis",dlock_outcome="acquired"} 1`,
		`dlock_leases_held{dlock_backend="redis"} 1`,
		"dlock_acquire_duration_seconds_bucket",
		"dlock_leases_lost_total",
	} {
		if !strings.Contains(body, name) {
			t.Errorf("scrape lacks %q:\n%s", name, body)
		}
	}
}
