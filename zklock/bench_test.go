package zklock_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/zklock"
	"github.com/go-zookeeper/zk"
)

// BenchmarkHandoff measures lock hand-offs per second with n goroutines
// contending for one key (16: the acceptance case; 2: the common case of
// one waiter), each with its own session (zklock: its own connection,
// Backend and dlock.Client; the peer: its own connection and
// go-zookeeper's zk.Lock), each holding the lock about 100µs.
//
// Both sets of n workers are set up once and take turns in short slices
// (only one set runs at a time), so that both see the same machine: the
// load of a shared machine drifts over seconds, which makes back-to-back
// runs of several seconds incomparable. Reported: the median rate of each
// over its slices, and the median ratio of adjacent slice pairs.
//
//	go test -run '^$' -bench Handoff -benchtime 1x
func BenchmarkHandoff(b *testing.B) {
	for _, n := range []int{16, 2} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) { benchHandoff(b, n) })
	}
}

func benchHandoff(b *testing.B, workers int) {
	const (
		hold    = 100 * time.Microsecond
		slice   = 250 * time.Millisecond
		pairs   = 40
		session = 10 * time.Second
	)
	key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	ours := newContenders(workers, hold, func() (lock, unlock, close func()) {
		_, be, err := zklock.Connect([]string{zkServer.Addr()}, session, zklock.WithLogger(quiet{}))
		if err != nil {
			b.Fatal(err)
		}
		c := dlock.New(be, dlock.WithTTL(session))
		var l *dlock.Lease
		lock = func() {
			var err error
			if l, err = c.Acquire(context.Background(), key); err != nil {
				b.Error(err)
			}
		}
		unlock = func() {
			if err := l.Release(context.Background()); err != nil {
				b.Error(err)
			}
		}
		return lock, unlock, func() { c.Close() }
	})
	defer ours.close()
	peer := newContenders(workers, hold, func() (lock, unlock, close func()) {
		conn, _, err := zk.Connect([]string{zkServer.Addr()}, session, zk.WithLogger(quiet{}))
		if err != nil {
			b.Fatal(err)
		}
		zl := zk.NewLock(conn, "/zklock-bench/"+key, zk.WorldACL(zk.PermAll))
		lock = func() {
			if err := zl.Lock(); err != nil {
				b.Error(err)
			}
		}
		unlock = func() {
			if err := zl.Unlock(); err != nil {
				b.Error(err)
			}
		}
		return lock, unlock, conn.Close
	})
	defer peer.close()

	for range 4 { // warm-up: the JVM's JIT compiler, parent nodes
		ours.run(slice)
		peer.run(slice)
	}
	var o, p, ratio []float64
	for i := 0; i < pairs; i++ {
		var x, y float64
		if i%2 == 0 {
			x, y = ours.run(slice), peer.run(slice)
		} else {
			y, x = peer.run(slice), ours.run(slice)
		}
		o, p, ratio = append(o, x), append(p, y), append(ratio, x/y)
	}
	b.Logf("zklock  hand-offs/s per slice: %.0f", o)
	b.Logf("zk.Lock hand-offs/s per slice: %.0f", p)
	b.ReportMetric(median(o), "zklock-handoffs/s")
	b.ReportMetric(median(p), "zk.Lock-handoffs/s")
	b.ReportMetric(median(ratio), "median-ratio")
}

// contenders are goroutines that take turns holding one lock, each with
// its own session, while run lets them.
type contenders struct {
	hold    time.Duration
	workers []contender
	grants  atomic.Int64
}

type contender struct{ lock, unlock, close func() }

func newContenders(n int, hold time.Duration, setup func() (lock, unlock, close func())) *contenders {
	c := &contenders{hold: hold}
	for range n {
		var w contender
		w.lock, w.unlock, w.close = setup()
		c.workers = append(c.workers, w)
	}
	return c
}

// run lets the workers contend for d and returns the grants per second,
// counting the grants of the workers' last turns too.
func (c *contenders) run(d time.Duration) float64 {
	var (
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	c.grants.Store(0)
	began := time.Now()
	for _, w := range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				w.lock()
				c.grants.Add(1)
				time.Sleep(c.hold)
				w.unlock()
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	return float64(c.grants.Load()) / time.Since(began).Seconds()
}

func (c *contenders) close() {
	for _, w := range c.workers {
		w.close()
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	}
	n := len(s)
	return (s[n/2-1] + s[n/2]) / 2
}
