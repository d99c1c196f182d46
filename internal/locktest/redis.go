package locktest

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock"
)

// Closing fails the test if v.Err() reports an error (a Backend or Client
// built with invalid options), closes v when the test ends, reporting a
// Close error, and returns v.
func Closing[T interface {
	Err() error
	Close() error
}](t testing.TB, v T) T {
	t.Helper()
	if err := v.Err(); err != nil {
		t.Fatalf("%T: %v", v, err)
	}
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("%T.Close: %v", v, err)
		}
	})
	return v
}

// CommandCalls sums the calls of the named commands ("publish",
// "evalsha", ...) in the text of a Redis INFO commandstats reply, or of
// every command (the redis.call of scripts included) when names is empty.
func CommandCalls(info string, names ...string) int {
	n := 0
	for _, line := range strings.Split(info, "\n") {
		stat, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, rest, ok := strings.Cut(stat, ":calls=")
		if !ok || len(names) > 0 && !slices.Contains(names, name) {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		v, _ := strconv.Atoi(calls)
		n += v
	}
	return n
}

// Deploy starts servers with start for the test and stops them when it
// ends, failing the test if either fails; with -short it skips the test,
// giving why. It returns what start returned.
func Deploy[S interface{ Stop() error }](t testing.TB, why string, start func() (S, error)) S {
	t.Helper()
	if testing.Short() {
		t.Skip(why)
	}
	return Own(t, start)
}

// Own starts servers with start for the test and stops them when it
// ends, failing the test if either fails. It returns what start returned.
func Own[S interface{ Stop() error }](t testing.TB, start func() (S, error)) S {
	t.Helper()
	s, err := start()
	if err != nil {
		t.Fatalf("starting the servers: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping the servers: %v", err)
		}
	})
	return s
}

// Peak counts the holders inside a critical section and the most that
// were inside at once. The zero value is ready; it is safe for concurrent
// use.
type Peak struct{ inside, most atomic.Int64 }

// Enter counts a holder in.
func (p *Peak) Enter() {
	v := p.inside.Add(1)
	for m := p.most.Load(); v > m && !p.most.CompareAndSwap(m, v); m = p.most.Load() {
	}
}

// Leave counts a holder out.
func (p *Peak) Leave() { p.inside.Add(-1) }

// Most returns the most holders that were inside at once.
func (p *Peak) Most() int64 { return p.most.Load() }

// Lost returns how many of ls have ended: their Done channel is closed.
func Lost(ls []*dlock.Lease) int {
	n := 0
	for _, l := range ls {
		select {
		case <-l.Done():
			n++
		default:
		}
	}
	return n
}

// Workers runs fn(w, r) for the rounds r = 0..rounds-1 on each of n
// goroutines w = 0..n-1, a worker stopping at its first error, and returns
// the workers' errors joined (nil if none).
func Workers(n, rounds int, fn func(w, r int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				if errs[w] = fn(w, r); errs[w] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
