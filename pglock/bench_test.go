package pglock_test

import (
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/scale"
	"github.com/dlock-go/dlock/pglock"
)

// counter is a pgx tracer counting the requests (statements, and
// pipelines of statements sent in one round trip) a client sends.
type counter struct{ n *atomic.Int64 }

func (c counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart counts a pipeline of statements as one request: one
// round trip.
func (c counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// countedPool returns a pool whose statements (and those of connections
// made from its config, such as pglock's listener) add to n.
func countedPool(b *testing.B, n *atomic.Int64, conns int32) *pgxpool.Pool {
	b.Helper()
	return openPool(b, srv.DSN(), func(cfg *pgxpool.Config) {
		cfg.MaxConns = conns
		cfg.ConnConfig.Tracer = counter{n}
	})
}

// A variant takes and gives back one lock: acquire blocks (or retries)
// until the lock is held and returns the release.
type variant struct {
	name string
	reqs atomic.Int64
	// worker returns the acquire function of one worker (its own pool,
	// like a process of its own).
	worker func(b *testing.B, v *variant) func(ctx context.Context, key string) (release func(), err error)
}

// pglockVariant goes through dlock.Client and pglock.
func pglockVariant() *variant {
	return clientVariant("pglock", func(p *pgxpool.Pool) dlock.Backend { return pglock.New(p) })
}

// sessionVariant goes through dlock.Client and pglock's session mode.
func sessionVariant() *variant {
	return clientVariant("pglock-session", func(p *pgxpool.Pool) dlock.Backend { return pglock.NewSession(p) })
}

// clientVariant goes through dlock.Client and the backend that
// newBackend builds on each worker's pool.
func clientVariant(name string, newBackend func(*pgxpool.Pool) dlock.Backend) *variant {
	return &variant{name: name, worker: func(b *testing.B, v *variant) func(context.Context, string) (func(), error) {
		c := dlock.New(newBackend(countedPool(b, &v.reqs, 4)), dlock.WithTTL(10*time.Second))
		b.Cleanup(func() { c.Close() })
		return func(ctx context.Context, key string) (func(), error) {
			l, err := c.Acquire(ctx, key)
			if err != nil {
				return nil, err
			}
			return func() { l.Release(context.Background()) }, nil
		}
	}}
}

// advisoryVariant is the floor of a session advisory lock: one
// pg_advisory_lock (blocking on the server when contended) and one
// pg_advisory_unlock on a pinned connection. It does not survive
// transaction pooling and has no TTL or fence.
func advisoryVariant() *variant {
	return &variant{name: "advisory", worker: func(b *testing.B, v *variant) func(context.Context, string) (func(), error) {
		conn, err := countedPool(b, &v.reqs, 1).Acquire(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(conn.Release)
		return func(ctx context.Context, key string) (func(), error) {
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", key); err != nil {
				return nil, err
			}
			return func() {
				conn.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext($1))", key)
			}, nil
		}
	}}
}

// leaseVariant is the floor of a lease table as cirello.io/pglock keeps
// one: one upsert with a record version per attempt (retried after 1ms
// while held), one delete per release. No renewal, fence sequence,
// re-entry or notification.
func leaseVariant() *variant {
	return &variant{name: "lease-table", worker: func(b *testing.B, v *variant) func(context.Context, string) (func(), error) {
		pool := countedPool(b, &v.reqs, 4)
		if _, err := pool.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS bench_floor
(key text PRIMARY KEY, owner text NOT NULL, version bigint NOT NULL, expires timestamptz NOT NULL)`); err != nil {
			b.Fatal(err)
		}
		owner := rand.Text()
		return func(ctx context.Context, key string) (func(), error) {
			for {
				var version int64
				err := pool.QueryRow(ctx, `INSERT INTO bench_floor AS f (key, owner, version, expires)
VALUES ($1, $2, 1, now() + interval '10 seconds')
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, version = f.version + 1, expires = excluded.expires
WHERE f.expires < now() RETURNING version`, key, owner).Scan(&version)
				if err == nil {
					return func() {
						pool.Exec(context.Background(), "DELETE FROM bench_floor WHERE key = $1 AND owner = $2 AND version = $3", key, owner, version)
					}, nil
				}
				if !errors.Is(err, pgx.ErrNoRows) {
					return nil, err
				}
				t := time.NewTimer(time.Millisecond)
				select {
				case <-ctx.Done():
					t.Stop()
					return nil, ctx.Err()
				case <-t.C:
				}
			}
		}
	}}
}

// run measures the variants in turns: rounds × (one slice per variant),
// so that all see the same machine while its load drifts. In a slice,
// workers acquire key, hold it for hold, release, and repeat. It returns
// per variant the median acquisitions per second and requests per
// acquisition, and the median per-round ratio of each to the last
// variant.
func run(b *testing.B, vs []*variant, workers, rounds int, slice, hold time.Duration) {
	acquire := make([][]func(context.Context, string) (func(), error), len(vs))
	for i, v := range vs {
		for range workers {
			acquire[i] = append(acquire[i], v.worker(b, v))
		}
	}
	rates := make([][]float64, len(vs))
	reqs := make([][]float64, len(vs))
	key := "bench." + rand.Text()[:8]
	for r := 0; r < rounds+1; r++ { // round 0 warms up
		for i, v := range vs {
			var n atomic.Int64
			r0 := v.reqs.Load()
			start := time.Now()
			end := start.Add(slice)
			var wg sync.WaitGroup
			for _, acq := range acquire[i] {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Every acquisition completes (a cancelled one could
					// leave a grant behind for its TTL): workers stop
					// between acquisitions, and waiters drain as the
					// slice ends.
					for time.Now().Before(end) {
						release, err := acq(context.Background(), key)
						if err != nil {
							b.Errorf("%s: %v", v.name, err)
							return
						}
						if hold > 0 {
							locktest.Hold(hold) // the work done under the lock: what the benchmark holds it for
						}
						n.Add(1)
						release()
					}
				}()
			}
			wg.Wait()
			if r == 0 {
				continue
			}
			rates[i] = append(rates[i], float64(n.Load())/time.Since(start).Seconds())
			reqs[i] = append(reqs[i], float64(v.reqs.Load()-r0)/float64(max(n.Load(), 1)))
		}
	}
	last := len(vs) - 1
	for i, v := range vs {
		var ratios []float64
		for r := range rates[i] {
			ratios = append(ratios, rates[i][r]/rates[last][r])
		}
		b.ReportMetric(median(rates[i]), v.name+"-acq/s")
		b.ReportMetric(median(reqs[i]), v.name+"-req/acq")
		if i != last {
			b.ReportMetric(median(ratios), v.name+"/"+vs[last].name)
			b.Logf("%s/%s per round: %.2f", v.name, vs[last].name, ratios)
		}
	}
	b.Logf("load average: %s", scale.LoadAvg())
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// BenchmarkS1 is uncontended acquire+release by one worker: pglock (lease
// table, and session mode) through dlock.Client against the advisory-lock
// floor and the lease-table floor. The variants take turns one
// acquire+release each (2000 rounds after 200 to warm up), so that all
// see the same load on a busy machine. Reported per variant: acquisitions
// per second (from the median cycle), statements per acquisition, and the
// ratio of the lease-table floor's median cycle to its own.
//
//	go test -run '^$' -bench S1 -benchtime 1x -count 5
func BenchmarkS1(b *testing.B) {
	for range b.N {
		runTurns(b, []*variant{pglockVariant(), sessionVariant(), advisoryVariant(), leaseVariant()}, 200, 2000)
	}
}

// runTurns measures uncontended cycles (acquire then release, one worker
// per variant) in turns: every round runs one cycle of each variant, and
// each variant's median cycle is compared with the last variant's.
func runTurns(b *testing.B, vs []*variant, warm, rounds int) {
	acquire := make([]func(context.Context, string) (func(), error), len(vs))
	keys := make([]string, len(vs))
	for i, v := range vs {
		acquire[i] = v.worker(b, v)
		keys[i] = "bench." + rand.Text()[:8]
	}
	cycles := make([][]float64, len(vs))
	r0 := make([]int64, len(vs))
	for r := range warm + rounds {
		if r == warm {
			for i, v := range vs {
				r0[i] = v.reqs.Load()
			}
		}
		for i, v := range vs {
			start := time.Now()
			release, err := acquire[i](context.Background(), keys[i])
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			release()
			if r >= warm {
				cycles[i] = append(cycles[i], float64(time.Since(start)))
			}
		}
	}
	last := len(vs) - 1
	floor := median(cycles[last])
	for i, v := range vs {
		m := median(cycles[i])
		b.ReportMetric(float64(time.Second)/m, v.name+"-acq/s")
		b.ReportMetric(float64(v.reqs.Load()-r0[i])/float64(rounds), v.name+"-req/acq")
		if i != last {
			b.ReportMetric(floor/m, v.name+"/"+vs[last].name)
		}
	}
	b.Logf("load average: %s", scale.LoadAvg())
}

// BenchmarkS3 is contention: 8 workers, each with its own pool (and
// pglock Client), take one key in turns and hold it 100µs; the same three
// variants and report as BenchmarkS1, in 500ms slices (9 rounds). The
// advisory floor waits on the server; the lease-table floor polls every
// millisecond; pglock waits for the notification of its turn (one waiter
// woken per release), bounded by the holder's TTL.
//
//	go test -run '^$' -bench S3 -benchtime 1x
func BenchmarkS3(b *testing.B) {
	for range b.N {
		run(b, []*variant{pglockVariant(), sessionVariant(), advisoryVariant(), leaseVariant()}, 8, 9, 500*time.Millisecond, 100*time.Microsecond)
	}
}
