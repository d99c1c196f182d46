package locktest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest/testmain"
)

// A holder process is the test binary run again (its TestHolderProcess)
// to take one hold and keep it until it is killed with SIGKILL, like a
// crashed program: no release, no revocation.
const (
	holderKindEnv = "DLOCK_TEST_HOLDER_KIND" // set only in a holder process
	holderKeyEnv  = "DLOCK_TEST_HOLDER_KEY"
)

// InHolderProcess reports whether the test binary runs as a holder
// process started by StartHolder.
func InHolderProcess() bool { return os.Getenv(holderKindEnv) != "" }

// ServerMain runs the tests of m on a server that start returns, stored in
// *srv and stopped after the tests (testmain.Run, name prefixing its
// messages); a holder process runs them without a server. It exits the
// process.
func ServerMain[S interface{ Stop() error }](m *testing.M, name string, srv *S, start func() (S, error)) {
	if InHolderProcess() {
		os.Exit(m.Run())
	}
	var err error
	if *srv, err = start(); err != nil {
		testmain.Fail(name, err)
	}
	testmain.Run(m, name, (*srv).Stop)
}

// acquireKind takes a hold of kind on key through c: the lock, one permit
// of a semaphore of 1, or a read hold of a read-write lock.
func acquireKind(ctx context.Context, c *dlock.Client, key string, kind dlock.Kind, opts ...dlock.Option) (*dlock.Lease, error) {
	switch kind {
	case dlock.KindPermit:
		return c.Semaphore(key, 1).Acquire(ctx, opts...)
	case dlock.KindRead:
		return c.RWLock(key).RLock(ctx, opts...)
	}
	return c.Acquire(ctx, key, opts...)
}

// RunHolder, in a holder process, takes the hold StartHolder asked for
// through c, prints "HELD <fence>" and keeps the hold (renewed by c's
// watchdog) until the process is killed. It fails the test if the hold is
// not granted or is lost first.
func RunHolder(t testing.TB, c *dlock.Client) {
	t.Helper()
	var kind dlock.Kind
	switch os.Getenv(holderKindEnv) {
	case dlock.KindPermit.String():
		kind = dlock.KindPermit
	case dlock.KindRead.String():
		kind = dlock.KindRead
	}
	l, err := acquireKind(context.Background(), c, os.Getenv(holderKeyEnv), kind)
	if err != nil {
		t.Fatalf("holder process: %v", err)
	}
	fmt.Printf("HELD %d\n", l.Fence())
	<-l.Done()
	t.Fatalf("holder process: lease lost before the process was killed: %v", l.Err())
}

// StartHolder runs the test binary again as a holder process taking a
// hold of kind on key, with env ("NAME=value") added to its environment
// for the package's TestHolderProcess. It returns the process once it
// reported the hold taken, and the hold's fence; it fails the test if
// that takes more than 30 s. The process is killed, by PID, when the test
// ends.
func StartHolder(t testing.TB, key string, kind dlock.Kind, env ...string) (*exec.Cmd, uint64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHolderProcess$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), holderKindEnv+"="+kind.String(), holderKeyEnv+"="+key), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start holder process: %v", err)
	}
	held := make(chan uint64, 1)
	drained := make(chan struct{})
	var other []string // what else it printed, read once drained is closed
	go func() {
		defer close(drained)
		for s := bufio.NewScanner(out); s.Scan(); {
			if f, ok := strings.CutPrefix(s.Text(), "HELD "); ok {
				n, _ := strconv.ParseUint(f, 10, 64)
				held <- n
			} else {
				other = append(other, s.Text())
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill() // by PID; a no-op once it has exited
		<-drained
		cmd.Wait()
	})
	select {
	case f := <-held:
		return cmd, f
	case <-drained:
		t.Fatalf("holder process ended without the hold:\n%s", strings.Join(other, "\n"))
	case <-time.After(30 * time.Second):
		t.Fatal("holder process did not report the hold taken within 30s")
	}
	return nil, 0
}

// HolderKill is a hold taken by a process that is then killed.
type HolderKill struct {
	Key  string
	Kind dlock.Kind
	// Env is added to the holder process's environment (see StartHolder).
	Env []string
	// Bound is the holder's TTL or session timeout: the time the server
	// takes to notice the holder is gone.
	Bound time.Duration
	// Waiter waits for the key with WaitOpts: for a permit when Kind is
	// KindPermit, else for the lock (a writer behind a reader).
	Waiter   *dlock.Client
	WaitOpts []dlock.Option
	// Queued returns once the waiter is queued behind the holder.
	Queued func(t testing.TB)
	// Gone reports whether the server has removed the killed holder's
	// hold (its entry or node). KillHolder polls it from the kill on, so
	// that a server slow to notice (a lease revocation held up by load)
	// is told apart from a waiter slow to take the lock. It runs on its
	// own goroutine and must not call t's Fatal methods.
	Gone func() bool
}

// KillHolder starts a holder process for h and a waiter behind it, kills
// the holder with SIGKILL once the waiter is queued, and fails the test
// unless the waiter is granted with a fence above the killed hold's,
// within one second of the later of h.Bound after the kill and the
// server's removal of the hold (as h.Gone first reports it); the hold must
// be gone once the waiter has the key.
func KillHolder(t testing.TB, h HolderKill) {
	t.Helper()
	cmd, fence := StartHolder(t, h.Key, h.Kind, h.Env...)
	ctx := Ctx(t, time.Minute)
	wait := Go(func() (*dlock.Lease, error) {
		if h.Kind == dlock.KindPermit {
			return h.Waiter.Semaphore(h.Key, 1).Acquire(ctx, h.WaitOpts...)
		}
		return h.Waiter.Acquire(ctx, h.Key, h.WaitOpts...)
	})
	h.Queued(t)
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("SIGKILL holder process (pid %d): %v", cmd.Process.Pid, err)
	}
	gone := make(chan time.Duration, 1)
	go func() {
		Poll(time.Minute, func() bool { return ctx.Err() != nil || h.Gone() })
		gone <- time.Since(killed)
	}()
	l := Granted(t, wait, time.Minute)
	took := time.Since(killed)
	defer l.Release(context.Background())
	var removed time.Duration
	select {
	case removed = <-gone:
	case <-time.After(10 * time.Second):
		t.Fatalf("the killed %s hold was still on the server 10s after the waiter was granted", h.Kind)
	}
	t.Logf("waiter granted %v after the %s holder process was SIGKILLed, the server removed its hold after %v (bound %v)",
		took.Round(time.Millisecond), h.Kind, removed.Round(time.Millisecond), h.Bound)
	if limit := max(h.Bound, removed) + time.Second; took > limit {
		t.Errorf("waiter granted %v after the kill, want within %v (a second after the bound or the server's removal)", took, limit)
	}
	if l.Fence() <= fence {
		t.Errorf("fence: got %d, want > the killed holder's %d", l.Fence(), fence)
	}
}

// Proxy forwards the TCP connections it accepts on a loopback port to a
// server, for tests that cut, stall or delay the traffic between a client
// and its server.
type Proxy struct {
	ln     net.Listener
	target string
	admit  func(net.Conn) bool
	pipe   func(client, server net.Conn) (up, down func())

	mu        sync.Mutex
	conns     map[net.Conn]bool // forwarded connections, both ends; nil once closed
	forwarded int
	wg        sync.WaitGroup
}

// StartProxy starts a Proxy to target. For each connection it accepts,
// admit (if not nil) may take the connection over and return false (to
// close it or leave it unanswered); otherwise the Proxy dials target and
// runs up (client to server) and down (server to client), as pipe returns
// them for the two connections, each on its own goroutine, closing both
// connections when either returns. A nil pipe copies the bytes as they
// come. The Proxy closes its listener and every forwarded connection, and
// waits for its goroutines, when the test ends.
func StartProxy(t testing.TB, target string, admit func(net.Conn) bool, pipe func(client, server net.Conn) (up, down func())) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if pipe == nil {
		pipe = func(c, s net.Conn) (func(), func()) {
			return func() { io.Copy(s, c) }, func() { io.Copy(c, s) }
		}
	}
	p := &Proxy{ln: ln, target: target, admit: admit, pipe: pipe, conns: make(map[net.Conn]bool)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.conns = nil
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Addr returns the address the Proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Drop closes every connection forwarded so far; new ones are forwarded
// as before.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Forwarded returns the number of connections forwarded so far.
func (p *Proxy) Forwarded() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forwarded
}

// accept forwards the connections the listener accepts until it closes.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.admit != nil && !p.admit(c) {
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.conns == nil { // closed meanwhile
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns[c], p.conns[s] = true, true
		p.forwarded++
		p.wg.Add(2)
		p.mu.Unlock()
		up, down := p.pipe(c, s)
		for _, f := range []func(){up, down} {
			go func() {
				defer p.wg.Done()
				defer s.Close()
				defer c.Close()
				f()
			}()
		}
	}
}

// Work stands for a holder's work under l: it returns true after d, or
// false as soon as l is lost.
func Work(l *dlock.Lease, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.Done():
		return false
	}
}

// Counts counts events by key, such as the requests a client sends. The
// zero value is ready to use; it is safe for concurrent use.
type Counts[K comparable] struct {
	mu sync.Mutex
	m  map[K]int
}

// Add counts one event of k.
func (c *Counts[K]) Add(k K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[K]int)
	}
	c.m[k]++
}

// Get returns the events of k counted since the last Take.
func (c *Counts[K]) Get(k K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[k]
}

// Snapshot returns the counts since the last Take, as a new map.
func (c *Counts[K]) Snapshot() map[K]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[K]int, len(c.m))
	maps.Copy(m, c.m)
	return m
}

// Take returns the counts since the last Take and starts counting anew.
func (c *Counts[K]) Take() map[K]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.m
	c.m = nil
	if m == nil {
		m = make(map[K]int)
	}
	return m
}
