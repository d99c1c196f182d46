// Package handoff is the harness of the lock hand-off benchmarks. Sets of
// workers contend for one lock, each worker with a connection of its own,
// like separate processes; the sets take turns in short slices, in a
// rotating order, so that all see the same machine (the load of a shared
// machine drifts over seconds, which makes back-to-back runs of several
// seconds incomparable), and each set's rate is compared with the peer
// library's set of the same round.
package handoff

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// A Worker takes the lock under test (Lock), gives it back (Unlock) and
// closes its connection (Close).
type Worker struct{ Lock, Unlock, Close func() }

// Run runs bench as the sub-benchmarks workers=16 (many waiters) and
// workers=2 (one waiter).
func Run(b *testing.B, bench func(b *testing.B, workers int)) {
	for _, n := range []int{16, 2} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) { bench(b, n) })
	}
}

// ClientWorker returns a Worker that acquires and releases key through
// c, reporting errors to tb, and closes c.
func ClientWorker(tb testing.TB, c *dlock.Client, key string) Worker {
	var l *dlock.Lease
	return Worker{
		Lock: func() {
			var err error
			if l, err = c.Acquire(context.Background(), key); err != nil {
				tb.Error(err)
			}
		},
		Unlock: func() {
			if err := l.Release(context.Background()); err != nil {
				tb.Error(err)
			}
		},
		Close: func() { c.Close() },
	}
}

// A Set is workers that take turns holding one lock while Run lets them.
type Set struct {
	workers []Worker
	hold    func()
	Total   int64 // grants over every Run
}

// NewSet returns a Set of n workers made by newWorker; each holds the lock
// for as long as hold takes.
func NewSet(n int, hold func(), newWorker func() Worker) *Set {
	s := &Set{hold: hold}
	for range n {
		s.workers = append(s.workers, newWorker())
	}
	return s
}

// Run lets the workers contend for d and returns the grants per second,
// counting the grants of the workers' last turns too.
func (s *Set) Run(d time.Duration) float64 {
	var (
		stop   atomic.Bool
		grants atomic.Int64
		wg     sync.WaitGroup
	)
	began := time.Now()
	for _, w := range s.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				w.Lock()
				grants.Add(1)
				s.hold()
				w.Unlock()
			}
		}()
	}
	time.Sleep(d) // the slice's length: the workers hand the lock off meanwhile
	stop.Store(true)
	wg.Wait()
	s.Total += grants.Load()
	return float64(grants.Load()) / time.Since(began).Seconds()
}

// Close closes the workers' connections.
func (s *Set) Close() {
	for _, w := range s.workers {
		w.Close()
	}
}

// Metered is a Set and the counters M of the server it runs on, summed
// over its runs.
type Metered[M any] struct {
	*Set
	Srv    M
	scrape func() M
	add    func(sum *M, after, before M)
}

// NewMetered returns set with the counters srv: each Run adds to them,
// with add, the difference between what scrape reads after and before it.
func NewMetered[M any](set *Set, srv M, scrape func() M, add func(sum *M, after, before M)) *Metered[M] {
	return &Metered[M]{Set: set, Srv: srv, scrape: scrape, add: add}
}

// Run runs the set for d and returns its grants per second, adding what
// the server counted meanwhile to Srv.
func (m *Metered[M]) Run(d time.Duration) float64 {
	before := m.scrape()
	rate := m.Set.Run(d)
	m.add(&m.Srv, m.scrape(), before)
	return rate
}

// Compare runs sets, the peer's last, for rounds slices of length d each
// (see Rounds) and returns their rates and ratios. Unless tb has failed,
// it logs each set's rates under its name with their median, the median
// ratio to the peer, and per, its server's counters per grant.
func Compare[M any](tb testing.TB, names []string, sets []*Metered[M], rounds int, d time.Duration, per func(srv *M, grants int64) string) (rates, ratios [][]float64) {
	tb.Helper()
	rates, ratios = Rounds(len(sets), rounds, func(i int) float64 { return sets[i].Run(d) })
	if tb.Failed() {
		return rates, ratios
	}
	width := 0
	for _, name := range names {
		width = max(width, len(name)+1)
	}
	for i, name := range names {
		tb.Logf("%-*s hand-offs/s per slice: %.0f", width, name, rates[i])
		tb.Logf("%-*s median %.0f/s, median ratio to the peer %.2f; per grant: %s",
			width, name, Median(rates[i]), Median(ratios[i]), per(&sets[i].Srv, sets[i].Total))
	}
	return rates, ratios
}

// Rounds runs n sets, run(i) running set i for a slice and returning its
// rate: four warm-up rounds, then rounds rounds, each in an order rotated
// by one. It returns each set's rates and, per round, their ratio to the
// last set's rate (the peer's).
func Rounds(n, rounds int, run func(i int) float64) (rates, ratios [][]float64) {
	for range 4 { // warm-up: connections, leases, a JIT compiler
		for i := range n {
			run(i)
		}
	}
	rates, ratios = make([][]float64, n), make([][]float64, n)
	for r := range rounds {
		got := make([]float64, n)
		for k := range n {
			i := (r + k) % n
			got[i] = run(i)
		}
		peer := got[n-1]
		for i := range n {
			rates[i] = append(rates[i], got[i])
			ratios[i] = append(ratios[i], got[i]/peer)
		}
	}
	return rates, ratios
}

// Median returns the median of xs (the mean of the two middle values for
// an even count), 0 for none.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
