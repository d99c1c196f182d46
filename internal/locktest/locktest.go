// Package locktest is the test kit shared by dlock's own tests: unique
// keys, bounded contexts, acquisitions that must succeed or run on their
// own goroutine, waits for a condition instead of sleeps, Backends and
// Clients closed with the test (Closing), servers started for a test
// (Deploy, Own), concurrent workers and their peak (Workers, Peak), the
// work done under a lock (Hold), lost leases (Lost) and Redis command
// counts (CommandCalls), so that every package's tests use the same
// helpers instead of copies.
//
// A test that waits awaits what it waits for: a condition (WaitFor,
// Poll), the end of changes (Settle), an acquisition's outcome (Granted,
// or none for a while: NotWithin) or a Client's report that it waits
// (Waiting). Its subpackages hold the TestMain of packages whose tests
// share servers (testmain), the servers and backends of the framework
// adapters' tests (adaptertest) and the harness of the hand-off
// benchmarks (handoff).
package locktest

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Key returns a lock key unique to the test: its name, with "/" and "%"
// replaced by ".", and a random suffix.
func Key(t testing.TB) string {
	return keyName.Replace(t.Name()) + "." + rand.Text()[:8]
}

var keyName = strings.NewReplacer("/", ".", "%", ".")

// Ctx returns a context that ends after d or when the test ends.
func Ctx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// EnvDuration returns the duration the environment variable name sets, or
// def if it is not set; it fails the test unless the value is a positive
// duration.
func EnvDuration(t testing.TB, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration", name, v)
	}
	return d
}

// WaitFor polls cond every millisecond until it holds, failing the test
// with what if it does not within d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(d, cond) {
		t.Fatalf("timed out after %v waiting for: %s", d, what)
	}
}

// Poll polls cond every millisecond until it holds or d has passed, and
// reports whether it held. Unlike WaitFor it may run on any goroutine.
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// Settle calls state every quiet until two calls in a row return equal
// values (nothing changed for quiet), and returns the last one; it fails
// the test if that takes longer than d.
func Settle[T any](t testing.TB, d, quiet time.Duration, state func() T, equal func(a, b T) bool) T {
	t.Helper()
	deadline := time.Now().Add(d)
	last := state()
	for {
		time.Sleep(quiet)
		cur := state()
		if equal(cur, last) {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("still changing after %v: got %v, then %v", d, last, cur)
		}
		last = cur
	}
}

// Outcome is what an acquisition started by Go returned.
type Outcome struct {
	Lease *dlock.Lease
	Err   error
}

// Go runs acquire on a new goroutine and returns a channel that receives
// its outcome.
func Go(acquire func() (*dlock.Lease, error)) <-chan Outcome {
	ch := make(chan Outcome, 1)
	go func() {
		l, err := acquire()
		ch <- Outcome{l, err}
	}()
	return ch
}

// Granted waits up to d for the outcome of an acquisition started by Go
// and returns its lease; it fails the test if the acquisition failed or
// did not end within d.
func Granted(t testing.TB, ch <-chan Outcome, d time.Duration) *dlock.Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.Err != nil {
			t.Fatalf("acquisition: %v", r.Err)
		}
		return r.Lease
	case <-time.After(d):
		t.Fatalf("acquisition not granted within %v", d)
	}
	return nil
}

// NotYet fails the test if the acquisition started by Go has ended; what
// names it in the message.
func NotYet(t testing.TB, ch <-chan Outcome, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: ended (lease %v, error %v), want still waiting", what, r.Lease != nil, r.Err)
	default:
	}
}

// NotWithin fails the test if the acquisition started by Go ends within
// d; what names it in the message.
func NotWithin(t testing.TB, ch <-chan Outcome, d time.Duration, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: ended (lease %v, error %v) within %v, want still waiting", what, r.Lease != nil, r.Err, d)
	case <-time.After(d):
	}
}

// Waiting returns an option that makes a Client report when an
// acquisition starts waiting for a lock held elsewhere, and the channel it
// closes then (at the first dlock.EventWaitStart).
func Waiting() (dlock.Option, <-chan struct{}) {
	o := &waitObserver{ch: make(chan struct{})}
	return dlock.WithObserver(o), o.ch
}

// waitObserver closes ch at the first EventWaitStart it observes.
type waitObserver struct {
	once sync.Once
	ch   chan struct{}
}

// Observe closes o.ch at the first EventWaitStart and returns ctx.
func (o *waitObserver) Observe(ctx context.Context, e dlock.Event) context.Context {
	if e.Kind == dlock.EventWaitStart {
		o.once.Do(func() { close(o.ch) })
	}
	return ctx
}

// MustAcquire acquires key through c with ctx and opts, failing the test
// if that fails, and returns the lease.
func MustAcquire(t testing.TB, ctx context.Context, c *dlock.Client, key string, opts ...dlock.Option) *dlock.Lease {
	t.Helper()
	l, err := c.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	return l
}

// MustPermits acquires n permits of s with ctx, failing the test if that
// fails, and returns their leases.
func MustPermits(t testing.TB, ctx context.Context, s *dlock.Semaphore, n int) []*dlock.Lease {
	t.Helper()
	var ls []*dlock.Lease
	for range n {
		l, err := s.Acquire(ctx)
		if err != nil {
			t.Fatalf("Semaphore.Acquire: %v", err)
		}
		ls = append(ls, l)
	}
	return ls
}

// A Pauser is a server that can be paused and resumed.
type Pauser interface {
	Pause() error
	Resume() error
}

// Outage returns a conformance Harness's Outage: it pauses srv, named
// name in its messages, and returns the function that resumes it.
func Outage(name string, srv Pauser) func(t *testing.T) func() {
	return func(t *testing.T) func() {
		t.Helper()
		if err := srv.Pause(); err != nil {
			t.Fatalf("pause %s: %v", name, err)
		}
		return func() {
			if err := srv.Resume(); err != nil {
				t.Errorf("resume %s: %v", name, err)
			}
		}
	}
}
