package redislock_test

import (
	"context"
	"crypto/rand"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// Run with
//
//	go test -run '^$' -bench Contention -count 5 ./redislock/
//
// BenchmarkContention has 16 workers take one key in turn, each with its
// own go-redis client, Backend and dlock.Client (as 16 processes would
// have), holding the lock ≈100µs, with default options and with
// dlock.WithFIFO (both wait in the server-side queue), and, in the same
// run, the polling baseline: SET key token NX PX, 2ms sleep
// between tries, compare-and-delete release (what redsync and
// bsm/redislock do). It reports per run:
//
//	handoffs/s   acquisitions by a DIFFERENT worker than the previous one,
//	             per second (target: FIFO ≥ 2× the baseline)
//	jain         Jain's fairness index over the acquisitions per worker,
//	             (Σx)² / (n·Σx²): 1 is perfectly even (target ≥ 0.99)
//	reqs/acq     client requests per acquisition including its release,
//	             counted by a go-redis hook on every worker's client
//	             (ProcessHook: one per command; ProcessPipelineHook: one
//	             per command in the pipeline); pushed pub/sub messages are
//	             not requests (target ≤ 4)
//	p99wait-ms   99th percentile of the time an Acquire call took
//	ideal-ms     the ideal FIFO wait: workers × mean cycle (elapsed time /
//	             acquisitions)
//	p99/ideal    their ratio (target ≤ 2)
//	server-cpu-µs/acq  the redis-server's CPU time per acquisition (all
//	             its threads; commands, scripts, heartbeats, network I/O)
//	server-cmds/acq  commands the server ran per acquisition (INFO
//	             commandstats, redis.calls inside scripts included; target ≤ 15)
//	subs         SUBSCRIBE/UNSUBSCRIBE commands the server ran during the
//	             measured part (INFO commandstats; pub/sub commands bypass
//	             go-redis hooks): the wake channels are subscribed during
//	             the warm-up, once per Backend, so this should be 0
func BenchmarkContention(b *testing.B) {
	b.Run("Default", func(b *testing.B) { contention(b, defaultWorker) })
	b.Run("FIFO", func(b *testing.B) { contention(b, fifoWorker) })
	b.Run("PollingSetNX", func(b *testing.B) { contention(b, pollWorker) })
}

const (
	contentionWorkers = 16
	contentionHold    = 100 * time.Microsecond
)

// lockFunc takes the lock and returns the function that releases it.
type lockFunc func(ctx context.Context) (release func() error, err error)

// newWorker makes one worker's lock function on its own connection.
type newWorker func(b *testing.B, rdb *redis.Client, key string) lockFunc

func defaultWorker(b *testing.B, rdb *redis.Client, key string) lockFunc {
	return clientWorker(b, rdb, key)
}

func fifoWorker(b *testing.B, rdb *redis.Client, key string) lockFunc {
	return clientWorker(b, rdb, key, dlock.WithFIFO())
}

// clientWorker is the lock function of a dlock.Client with opts.
func clientWorker(b *testing.B, rdb *redis.Client, key string, opts ...dlock.Option) lockFunc {
	c := newClient(b, rdb, opts...)
	return func(ctx context.Context) (func() error, error) {
		l, err := c.Acquire(ctx, key)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
}

func pollWorker(b *testing.B, rdb *redis.Client, key string) lockFunc {
	if err := unlockScript.Load(context.Background(), rdb).Err(); err != nil {
		b.Fatal(err)
	}
	keys := []string{key}
	return func(ctx context.Context) (func() error, error) {
		token := rand.Text()
		for {
			ok, err := rdb.SetNX(ctx, key, token, 30*time.Second).Result()
			if err != nil {
				return nil, err
			}
			if ok {
				break
			}
			time.Sleep(2 * time.Millisecond) // the baseline under measurement: polling every 2ms
		}
		return func() error { return unlockScript.Run(ctx, rdb, keys, token).Err() }, nil
	}
}

func contention(b *testing.B, mk newWorker) {
	ctx := context.Background()
	k := key(b)
	admin := newRDB(b, srv.Addr())
	requests := make([]atomic.Int64, contentionWorkers)
	locks := make([]lockFunc, contentionWorkers)
	for i := range locks {
		rdb := newRDB(b, srv.Addr())
		rdb.AddHook(countHook(&requests[i]))
		locks[i] = mk(b, rdb, k)
		// Warm up: connections, scripts, subscriptions.
		release, err := locks[i](ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := release(); err != nil {
			b.Fatal(err)
		}
		requests[i].Store(0)
	}
	subsBefore := cmdCalls(b, admin, "subscribe", "unsubscribe")
	cmdsBefore := cmdCalls(b, admin)
	serverBefore := testserver.CPUTime(srv.PID())

	var (
		started  atomic.Int64
		wg       sync.WaitGroup
		last     atomic.Int64 // the previous holder
		handoffs atomic.Int64
		perW     = make([]int, contentionWorkers)
		waits    = make([][]time.Duration, contentionWorkers)
		errs     = make(chan error, contentionWorkers)
		relAt    atomic.Int64 // when the last release began (ns since start)
		gapMu    sync.Mutex
		gaps     []time.Duration // from a release to the next acquisition
	)
	last.Store(-1)
	b.ResetTimer()
	start := time.Now()
	for i := range locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for started.Add(1) <= int64(b.N) {
				t0 := time.Now()
				release, err := locks[i](ctx)
				if err != nil {
					errs <- err
					return
				}
				waits[i] = append(waits[i], time.Since(t0))
				if r := relAt.Load(); r > 0 {
					g := time.Since(start) - time.Duration(r)
					gapMu.Lock()
					gaps = append(gaps, g)
					gapMu.Unlock()
				}
				if last.Swap(int64(i)) != int64(i) {
					handoffs.Add(1)
				}
				perW[i]++
				for t := time.Now(); time.Since(t) < contentionHold; {
					// Hold the lock ≈100µs (a sleep would take far longer).
				}
				relAt.Store(int64(time.Since(start)))
				if err := release(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	subs := cmdCalls(b, admin, "subscribe", "unsubscribe") - subsBefore
	cmds := cmdCalls(b, admin) - cmdsBefore
	server := testserver.CPUTime(srv.PID()) - serverBefore

	acq, reqs := 0, int64(0)
	var sum, sumSq float64
	var all []time.Duration
	for i := range perW {
		acq += perW[i]
		reqs += requests[i].Load()
		x := float64(perW[i])
		sum += x
		sumSq += x * x
		all = append(all, waits[i]...)
	}
	if acq == 0 {
		return
	}
	slices.Sort(all)
	p99 := all[min(len(all)-1, int(math.Ceil(0.99*float64(len(all))))-1)]
	cycle := elapsed / time.Duration(acq)
	if testing.Verbose() {
		q := func(f float64) time.Duration { return all[min(len(all)-1, int(f*float64(len(all))))] }
		slices.Sort(gaps)
		if len(gaps) > 0 {
			g := func(f float64) time.Duration { return gaps[min(len(gaps)-1, int(f*float64(len(gaps))))] }
			var tot time.Duration
			for _, x := range gaps {
				tot += x
			}
			b.Logf("release→next acquisition: p50 %v p90 %v p99 %v p99.9 %v max %v, total %v of %v", g(0.5), g(0.9), g(0.99), g(0.999), gaps[len(gaps)-1], tot, elapsed)
		}
		b.Logf("waits: p10 %v p50 %v p90 %v p95 %v p99 %v p99.9 %v max %v; mean cycle %v", q(0.1), q(0.5), q(0.9), q(0.95), p99, q(0.999), all[len(all)-1], cycle)
	}
	ideal := contentionWorkers * cycle
	b.ReportMetric(float64(handoffs.Load())/elapsed.Seconds(), "handoffs/s")
	b.ReportMetric(sum*sum/(contentionWorkers*sumSq), "jain")
	b.ReportMetric(float64(reqs)/float64(acq), "reqs/acq")
	b.ReportMetric(float64(p99)/1e6, "p99wait-ms")
	b.ReportMetric(float64(ideal)/1e6, "ideal-ms")
	b.ReportMetric(float64(p99)/float64(ideal), "p99/ideal")
	b.ReportMetric(float64(subs), "subs")
	b.ReportMetric(float64(cmds)/float64(acq), "server-cmds/acq")
	b.ReportMetric(float64(acq)/elapsed.Seconds(), "acq/s")
	b.ReportMetric(float64(server.Nanoseconds())/1e3/float64(acq), "server-cpu-µs/acq")
}
