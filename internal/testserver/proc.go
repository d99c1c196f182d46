package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"
)

// DefaultStartTimeout is how long a Start function (and Restart) waits for a
// server to answer its protocol when the options leave StartTimeout at 0.
const DefaultStartTimeout = 60 * time.Second

// StopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
const StopGrace = 5 * time.Second

// killWait bounds the wait for a process to exit after SIGKILL; a process
// normally dies within milliseconds, so reaching it means something is badly
// wrong (for example a process stuck in uninterruptible sleep).
const killWait = 10 * time.Second

// ErrNotInstalled is matched (with errors.Is) by the error a Start function
// returns when a server binary or its jars cannot be found. Callers may use
// it to skip tests on machines without the servers.
var ErrNotInstalled = errors.New("testserver: server not installed")

// notInstalledError carries the user-facing message (which names the package
// to install) and matches ErrNotInstalled.
type notInstalledError struct{ msg string }

func (e *notInstalledError) Error() string { return e.msg }
func (e *notInstalledError) Unwrap() error { return ErrNotInstalled }

// lookPath finds bin in PATH or returns an error naming the Debian package.
func lookPath(bin, pkg string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", &notInstalledError{fmt.Sprintf(
			"testserver: %s not found in PATH; install it with: apt-get install -y %s (or run scripts/install-servers.sh)",
			bin, pkg)}
	}
	return p, nil
}

// errBind marks a start failure caused by a port that was already in use, so
// the caller can retry with fresh ports when it picked them itself.
var errBind = errors.New("address already in use")

// maxBindAttempts bounds the retries after bind failures on picked ports.
const maxBindAttempts = 5

// retryBind calls try until it succeeds, fails for another reason than a
// port in use, or has failed maxBindAttempts times, and returns its
// outcome (nil and the last error on failure). With fixed ports (the
// caller's, not picked) a port in use is not retried.
func retryBind[T any](fixed bool, try func() (*T, error)) (*T, error) {
	for attempt := 1; ; attempt++ {
		v, err := try()
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, errBind) || fixed || attempt == maxBindAttempts {
			return nil, err
		}
	}
}

// ---------------------------------------------------------------------------
// Ports

var ports struct {
	mu   sync.Mutex
	used map[int]bool
	// hook, if set (by tests), is asked first; a nonzero result is
	// returned as the picked port.
	hook func() int
}

// pickPort returns a loopback port that was free a moment ago and that this
// process has not handed out before. Ports are never handed out twice, even
// after their server stopped: a stopped server's port may still be held by a
// restarting or lingering process, and the range is large enough.
func pickPort() (int, error) {
	ports.mu.Lock()
	hook := ports.hook
	ports.mu.Unlock()
	if hook != nil {
		if p := hook(); p != 0 {
			return p, nil
		}
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("testserver: pick a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ports.mu.Lock()
		if ports.used == nil {
			ports.used = make(map[int]bool)
		}
		fresh := !ports.used[port]
		ports.used[port] = true
		ports.mu.Unlock()
		if fresh {
			return port, nil
		}
	}
	return 0, errors.New("testserver: pick a free port: no unused port after 100 tries")
}

// pickPorts returns n distinct ports from pickPort.
func pickPorts(n int) ([]int, error) {
	ps := make([]int, n)
	for i := range ps {
		p, err := pickPort()
		if err != nil {
			return nil, err
		}
		ps[i] = p
	}
	return ps, nil
}

// reservePort records an explicitly requested port so pickPort never hands it
// out to another server of this process.
func reservePort(port int) {
	ports.mu.Lock()
	if ports.used == nil {
		ports.used = make(map[int]bool)
	}
	ports.used[port] = true
	ports.mu.Unlock()
}

// ---------------------------------------------------------------------------
// Spawner: one goroutine locked to its OS thread forks every child.
//
// Linux delivers Pdeathsig when the *thread* that forked the child exits. The
// Go runtime ends an OS thread whenever a goroutine exits while locked to it
// (code that enters network namespaces does exactly that on purpose), and any
// goroutine may run on any thread, so a child forked from an ordinary
// goroutine could be SIGKILLed at a random moment. Forking from a thread that
// stays locked to our own goroutine while any child lives rules that out.
// The goroutine exits once no child is alive, so none is left behind.

type spawnReq struct {
	cmd  *exec.Cmd
	errc chan error
}

var spawner struct {
	mu   sync.Mutex
	live int // children alive plus starts in flight
	reqs chan spawnReq
}

func startCmd(cmd *exec.Cmd) error {
	spawner.mu.Lock()
	if spawner.reqs == nil {
		spawner.reqs = make(chan spawnReq)
		go spawnLoop(spawner.reqs)
	}
	spawner.live++
	reqs := spawner.reqs // stays open: our own count keeps live > 0
	spawner.mu.Unlock()

	r := spawnReq{cmd: cmd, errc: make(chan error, 1)}
	reqs <- r
	err := <-r.errc
	if err != nil {
		spawnDone()
	}
	return err
}

// spawnDone is called once per successful start, after the child was reaped.
func spawnDone() {
	spawner.mu.Lock()
	spawner.live--
	if spawner.live == 0 {
		close(spawner.reqs)
		spawner.reqs = nil
	}
	spawner.mu.Unlock()
}

func spawnLoop(reqs <-chan spawnReq) {
	runtime.LockOSThread()
	// Unlock before returning so the runtime keeps the thread; no child forked
	// from it is alive any more at this point.
	defer runtime.UnlockOSThread()
	for r := range reqs {
		r.errc <- r.cmd.Start()
	}
}

// ---------------------------------------------------------------------------
// proc: one running server process.

type proc struct {
	name     string // for messages, e.g. "redis-server 127.0.0.1:6380"
	cmd      *exec.Cmd
	pid      int
	done     chan struct{} // closed after the process was reaped
	waitErr  error         // valid after done is closed
	logPath  string
	logStart int64 // size of the log file when this process started
}

// spawn starts bin with args in dir, appending stdout and stderr to logPath.
// env nil means the current environment.
func spawn(name, bin string, args []string, dir, logPath string, env []string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testserver: %s: open log: %w", name, err)
	}
	defer f.Close() // the child has its own copy of the descriptor
	var off int64
	if st, err := f.Stat(); err == nil {
		off = st.Size()
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout = f // an *os.File is passed directly: no copying goroutines
	cmd.Stderr = f
	cmd.SysProcAttr = sysProcAttr()
	if err := startCmd(cmd); err != nil {
		return nil, fmt.Errorf("testserver: start %s: %w", name, err)
	}
	p := &proc{
		name:     name,
		cmd:      cmd,
		pid:      cmd.Process.Pid,
		done:     make(chan struct{}),
		logPath:  logPath,
		logStart: off,
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
		spawnDone()
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM (and SIGCONT, so a paused process can handle it), waits
// up to grace, then kills. It returns once the process has exited.
func (p *proc) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	if err := p.terminate(); err != nil {
		return p.kill()
	}
	if p.exitsWithin(grace) {
		return nil
	}
	return p.kill()
}

// kill sends SIGKILL to the process group and waits for the process to exit.
func (p *proc) kill() error {
	if p.exited() {
		return nil
	}
	if err := p.signalGroup(sigKill); err != nil && !p.exited() {
		return fmt.Errorf("testserver: kill %s (pid %d): %w", p.name, p.pid, err)
	}
	if p.exitsWithin(killWait) {
		return nil
	}
	return fmt.Errorf("testserver: %s (pid %d) did not exit %v after SIGKILL", p.name, p.pid, killWait)
}

// exitsWithin waits up to d for the process to exit and reports whether
// it did.
func (p *proc) exitsWithin(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// pause and resume send SIGSTOP / SIGCONT to the process group.
// pause stops the process group with SIGSTOP and returns once the
// server's threads are stopped (at most a second later).
func (p *proc) pause() error {
	if err := p.signalChecked(sigStop, "pause"); err != nil {
		return err
	}
	waitStopped(p.pid, time.Second)
	return nil
}

func (p *proc) resume() error { return p.signalChecked(sigCont, "resume") }

func (p *proc) signalChecked(sig sysSignal, what string) error {
	if p.exited() {
		return fmt.Errorf("testserver: %s %s: process %d has exited", what, p.name, p.pid)
	}
	if err := p.signalGroup(sig); err != nil {
		return fmt.Errorf("testserver: %s %s (pid %d): %w", what, p.name, p.pid, err)
	}
	return nil
}

// logTail returns the last lines written to the log by this process.
func (p *proc) logTail() string {
	return readTail(p.logPath, p.logStart)
}

const tailBytes = 4096
const tailLines = 30

// readTail returns at most tailLines lines / tailBytes bytes from the end of
// the file, not looking before offset from.
func readTail(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log %s: %v)", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(cannot read log %s: %v)", path, err)
	}
	start := max(from, st.Size()-tailBytes, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, start, st.Size()-start))
	if err != nil {
		return fmt.Sprintf("(cannot read log %s: %v)", path, err)
	}
	b = bytes.TrimRight(b, "\n")
	lines := strings.Split(string(b), "\n")
	if start > from && len(lines) > 1 {
		lines = lines[1:] // first line is probably cut
	}
	if len(lines) > tailLines {
		lines = lines[len(lines)-tailLines:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return "(log is empty)"
	}
	return strings.Join(lines, "\n")
}

// waitReady polls check until it succeeds while the process holds a
// listener on every one of ports, or until the process exits or timeout
// passes. On failure the error carries the tail of the log and wraps errBind
// when the log says a port was in use. It does not kill the process.
func (p *proc) waitReady(timeout time.Duration, ports []int, check func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if p.exited() {
			return p.startupExitError()
		}
		if last = check(); last == nil {
			if last = p.holdsListeners(ports); last == nil {
				return nil
			}
		}
		var ab abortError
		if errors.As(last, &ab) {
			return fmt.Errorf("testserver: %s (pid %d): gave up waiting: %w", p.name, p.pid, ab.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testserver: %s (pid %d) not ready after %v: %v\n--- tail of %s ---\n%s",
				p.name, p.pid, timeout, last, p.logPath, p.logTail())
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-p.done:
		case <-t.C:
		}
		t.Stop()
	}
}

func (p *proc) holdsListeners(ports []int) error {
	for _, port := range ports {
		ok, err := holdsListener(p.pid, port)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("port %d answers but is not held by pid %d", port, p.pid)
		}
	}
	return nil
}

// abortError, returned by a readiness probe, ends the wait at once.
type abortError struct{ err error }

func (e abortError) Error() string { return e.err.Error() }

func abort(err error) error { return abortError{err} }

// startError is a start failure; it matches errBind if a port was in use.
type startError struct {
	msg  string
	bind bool
}

func (e *startError) Error() string        { return e.msg }
func (e *startError) Is(target error) bool { return e.bind && target == errBind }

func (p *proc) startupExitError() error {
	return &startError{
		msg: fmt.Sprintf("testserver: %s (pid %d) exited during startup (%v)\n--- tail of %s ---\n%s",
			p.name, p.pid, p.waitErr, p.logPath, p.logTail()),
		bind: p.logContains("address already in use"),
	}
}

// logContains reports whether this process's part of the log (its first
// MiB) contains s, ignoring case.
func (p *proc) logContains(s string) bool {
	f, err := os.Open(p.logPath)
	if err != nil {
		return false
	}
	defer f.Close()
	b, _ := io.ReadAll(io.NewSectionReader(f, p.logStart, 1<<20))
	return bytes.Contains(bytes.ToLower(b), []byte(strings.ToLower(s)))
}

// filterEnv returns the current environment without variables whose names
// start with one of the prefixes (e.g. ETCD_, which etcd would read as flags).
func filterEnv(prefixes ...string) []string {
	var env []string
outer:
	for _, kv := range os.Environ() {
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				continue outer
			}
		}
		env = append(env, kv)
	}
	return env
}

func startTimeout(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("testserver: invalid StartTimeout %v: must not be negative", d)
	case d == 0:
		return DefaultStartTimeout, nil
	}
	return d, nil
}

func checkPort(port int) error {
	if port < 0 || port > 65535 {
		return fmt.Errorf("testserver: invalid Port %d", port)
	}
	return nil
}

// checkStart checks the Port and StartTimeout options of a server and
// returns the start timeout to use.
func checkStart(port int, d time.Duration) (time.Duration, error) {
	if err := checkPort(port); err != nil {
		return 0, err
	}
	return startTimeout(d)
}

// serverDir reserves port (unless 0, a free one picked later) and creates
// the temporary directory of a server of kind.
func serverDir(kind string, port int) (string, error) {
	if port != 0 {
		reservePort(port)
	}
	dir, err := os.MkdirTemp("", "dlock-testserver-"+kind+"-")
	if err != nil {
		return "", fmt.Errorf("testserver: %w", err)
	}
	return dir, nil
}

// StopAll stops every server concurrently and returns the errors joined with
// errors.Join (nil if all stopped cleanly). Nil servers are skipped.
func StopAll[T interface{ Stop() error }](servers ...T) error {
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		if any(s) == nil {
			continue
		}
		wg.Go(func() {
			errs[i] = s.Stop()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
