package etcdlock_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/locktest/handoff"
	"github.com/dlock-go/dlock/internal/scale"
)

// BenchmarkHandoff measures lock hand-offs per second with n goroutines
// contending for one key, each with its own etcd connection (etcdlock: its
// own Backend and dlock.Client; the peer: its own concurrency.Session and
// Mutex), each holding the lock about 100 µs, in package handoff's
// interleaved slices. The sets: etcdlock with its protocol switches on as
// in production, with the sharing of watches between waits off, with all
// off; then the peer. Reported per grant besides the rates: the etcd
// server's gRPC requests, WAL fsyncs and their time (/metrics), and the
// CPU time of the server and of this process.
//
//	go test -run '^$' -bench Handoff -benchtime 1x
//
// HANDOFF_SLICE sets another slice length, for the same 10 s per set
// (HANDOFF_SLICE=1s: 10 slices of 1 s): every slice starts with an empty
// queue that fills in a random order, new to the watches etcdlock keeps
// between waits, and Mutex's 100 ms cycles fit a short slice unevenly.
//
// concurrency.Mutex is capped by etcd's 100 ms catch-up of watches that
// start at an old revision (16 waiters per 100 ms), whatever the machine;
// etcdlock by CPU and the disk: per grant, two writes (queue, release),
// one serializable read (off the hand-off's path) and, with watches
// shared between waits, few watch creations; the etcd server and the
// clients spend about 1 ms and 0.6 ms of CPU per grant, which on a
// shared 2-core machine bounds the rate, and a release waits for the WAL
// fsyncs queued before it. TMPDIR=/dev/shm puts the test server's data
// directory on tmpfs, which takes a disk shared with other work out of the
// comparison (an additional figure, not a replacement).
func BenchmarkHandoff(b *testing.B) { handoff.Run(b, benchHandoff) }

func benchHandoff(b *testing.B, workers int) {
	const (
		hold = 100 * time.Microsecond
		ttl  = 10 * time.Second
	)
	// 40 slices of 250 ms per set, unless HANDOFF_SLICE sets another
	// slice length (the same 10 s in all).
	slice := locktest.EnvDuration(b, "HANDOFF_SLICE", 250*time.Millisecond)
	rounds := max(int(10*time.Second/slice), 1)
	key := locktest.Key(b)
	newOurs := func(p etcdlock.Protocol) *handoff.Metered[etcdMetrics] {
		return locktest.Contenders(workers, hold, func() handoff.Worker {
			eb := etcdlock.New(newCli(b, srv.Endpoints()))
			etcdlock.SetProtocol(eb, p)
			return handoff.ClientWorker(b, dlock.New(eb, dlock.WithTTL(ttl)), key)
		}, scrape, (*etcdMetrics).add)
	}
	// The sets take turns, in a rotating order. etcdlock runs with its
	// protocol switches on (as in production), then with new watches (and
	// a new watch stream) for every wait, then with all switches off: what
	// each saves.
	perWait := etcdlock.AllOn
	perWait.AnchorStream, perWait.ShareWatches = false, false
	sets := []*handoff.Metered[etcdMetrics]{newOurs(etcdlock.AllOn), newOurs(perWait), newOurs(etcdlock.Protocol{}), locktest.Contenders(workers, hold, func() handoff.Worker {
		s, err := concurrency.NewSession(newCli(b, srv.Endpoints()), concurrency.WithTTL(int(ttl/time.Second)))
		if err != nil {
			b.Fatalf("NewSession: %v", err)
		}
		m := concurrency.NewMutex(s, "/bench-mutex/"+key)
		return locktest.PeerWorker(b,
			func() error { return m.Lock(context.Background()) },
			func() error { return m.Unlock(context.Background()) },
			func() { s.Close() })
	}, scrape, (*etcdMetrics).add)}
	names := []string{"etcdlock", "etcdlock (watches per wait)", "etcdlock (all switches off)", "concurrency.Mutex"}
	for _, c := range sets {
		defer c.Close()
	}
	rates, ratios := handoff.Compare(b, names, sets, rounds, slice, (*etcdMetrics).per)
	if b.Failed() {
		return
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(handoff.Median(rates[0]), "etcdlock-handoffs/s")
	b.ReportMetric(handoff.Median(rates[len(sets)-1]), "Mutex-handoffs/s")
	b.ReportMetric(handoff.Median(ratios[0]), "median-ratio")
	b.ReportMetric(handoff.Median(ratios[2]), "legacy-median-ratio")
	b.ReportMetric(sets[0].Srv.requests()/float64(max(sets[0].Total, 1)), "etcdlock-rpcs/op")
	b.ReportMetric(sets[2].Srv.requests()/float64(max(sets[2].Total, 1)), "legacy-rpcs/op")
}

// etcdMetrics are counters from the etcd server's /metrics.
type etcdMetrics struct {
	fsyncs   float64            // WAL fsyncs
	fsyncSec float64            // seconds spent in them
	rpcs     map[string]float64 // gRPC messages received, by method
	cpu      locktest.CPU       // of the etcd process and the clients'
}

// scrape reads the test server's counters; on failure the figures are
// zero (they are informative only).
func scrape() etcdMetrics {
	m := etcdMetrics{rpcs: make(map[string]float64), cpu: locktest.SampleCPU(srv.PID())}
	resp, err := http.Get(srv.ClientURL() + "/metrics")
	if err != nil {
		return m
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(rest, 64)
		if err != nil {
			continue
		}
		switch {
		case name == "etcd_disk_wal_fsync_duration_seconds_count":
			m.fsyncs = v
		case name == "etcd_disk_wal_fsync_duration_seconds_sum":
			m.fsyncSec = v
		case strings.HasPrefix(name, "grpc_server_msg_received_total{"):
			_, method, _ := strings.Cut(name, `grpc_method="`)
			method, _, _ = strings.Cut(method, `"`)
			m.rpcs[method] += v
		}
	}
	return m
}

// add adds the difference after − before to m.
func (m *etcdMetrics) add(after, before etcdMetrics) {
	m.fsyncs += after.fsyncs - before.fsyncs
	m.fsyncSec += after.fsyncSec - before.fsyncSec
	m.cpu.Add(after.cpu, before.cpu)
	if m.rpcs == nil {
		m.rpcs = make(map[string]float64)
	}
	for k, v := range after.rpcs {
		if d := v - before.rpcs[k]; d > 0 {
			m.rpcs[k] += d
		}
	}
}

func (m *etcdMetrics) requests() float64 {
	var n float64
	for _, v := range m.rpcs {
		n += v
	}
	return n
}

// counts formats m's gRPC message counts by method.
func (m *etcdMetrics) counts() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m.rpcs)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m.rpcs[k]))
	}
	return strings.Join(parts, ", ")
}

// per formats m divided by n grants.
func (m *etcdMetrics) per(n int64) string {
	if n == 0 {
		return "no grants"
	}
	f := float64(n)
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m.rpcs)) {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, m.rpcs[k]/f))
	}
	return fmt.Sprintf("rpcs %.2f (%s), fsyncs %.2f, fsync %.3f ms, CPU ms: etcd %.2f, clients %.2f",
		m.requests()/f, strings.Join(parts, ", "), m.fsyncs/f, m.fsyncSec*1e3/f, m.cpu.Server*1e3/f, m.cpu.Clients*1e3/f)
}

// BenchmarkManyHeld holds many leases through one dlock.Client (auto-renew,
// TTL 10 s) on one Backend, like the bench module's S5, and reports per
// lease the heap growth and goroutines, and the round trips the client
// sends per 1,000 leases per renewal tick (TTL/3) while it holds them,
// counted on its sockets as S5 does (a write after a read is one round
// trip). It runs twice in the same conditions: with the Backend's one
// prefix watch for many held locks (production), then with a deletion
// watch per held lock (the threshold raised above N), and checks that no
// lease was lost.
//
//	go test -run '^$' -bench ManyHeld -benchtime 1x
//
// MANYHELD_N sets the number of leases (default 10,000), MANYHELD_HOLD how
// long they are held (default 10 s: three ticks); MANYHELD_HEAPPROF a file
// to write a heap profile to once they are all held (add
// -memprofilerate=512 for a detailed one).
func BenchmarkManyHeld(b *testing.B) {
	n := 10_000
	if v := os.Getenv("MANYHELD_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("MANYHELD_N=%q: want a positive integer", v)
		}
	}
	hold := locktest.EnvDuration(b, "MANYHELD_HOLD", 10*time.Second)
	for _, mode := range []struct {
		name string
		min  int
	}{{"prefix-watch", etcdlock.PrefixWatchMin()}, {"per-lock-watches", n + 1}} {
		b.Run(mode.name, func(b *testing.B) { benchManyHeld(b, n, hold, mode.min) })
	}
}

func benchManyHeld(b *testing.B, n int, hold time.Duration, prefixWatchMin int) {
	const ttl = 10 * time.Second
	var rts atomic.Int64
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   srv.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return scale.CountRequests(conn, &rts), nil
		})},
	})
	if err != nil {
		b.Fatalf("clientv3.New: %v", err)
	}
	defer cli.Close()
	eb := etcdlock.New(cli)
	etcdlock.SetPrefixWatchMin(eb, prefixWatchMin)
	c := dlock.New(eb, dlock.WithTTL(ttl))
	defer c.Close()
	prefix := locktest.Key(b) + "-"
	// Warm up: lease, connections, watch streams.
	if l, err := c.Acquire(context.Background(), prefix+"warm"); err != nil {
		b.Fatalf("Acquire: %v", err)
	} else if err := l.Release(context.Background()); err != nil {
		b.Fatalf("Release: %v", err)
	}
	leases := make([]*dlock.Lease, n)
	m0 := scale.Sample()
	began := time.Now()
	if err := scale.Each(n, 64, func(i int) (err error) {
		leases[i], err = c.Acquire(context.Background(), fmt.Sprintf("%s%06d", prefix, i))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	fill := time.Since(began)
	m1 := scale.Sample()
	if p := os.Getenv("MANYHELD_HEAPPROF"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			b.Error(err)
		}
		f.Close()
	}
	rts.Store(0)
	var srvDuring etcdMetrics // what the server received during the hold
	before := scrape()
	time.Sleep(hold) // the measured hold: the watchdog renews meanwhile
	held := rts.Load()
	srvDuring.add(scrape(), before)
	lost := locktest.Lost(leases)
	perTick := float64(held) / hold.Seconds() * (ttl / 3).Seconds() / (float64(n) / 1000)
	heap, stack := scale.PerItem(m0, m1, n)
	b.Logf("%d leases (load %s): fill %.1fs, heap %.0f B/lease, stacks %.0f B/lease, %.2f goroutines/lease, %d round trips in %v = %.2f per 1,000 leases per tick, %d lost",
		n, scale.LoadAvg(), fill.Seconds(), heap, stack,
		float64(m1.Goroutines-m0.Goroutines)/float64(n), held, hold, perTick, lost)
	b.Logf("gRPC messages the server received during the hold (all clients): %s", srvDuring.counts())
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(heap, "heap-B/lease")
	b.ReportMetric(float64(m1.Goroutines-m0.Goroutines)/float64(n), "goroutines/lease")
	b.ReportMetric(perTick, "rt/1k/tick")
	b.ReportMetric(fill.Seconds(), "fill-s")
	if lost > 0 {
		b.Errorf("got %d of %d leases lost, want 0", lost, n)
	}
	if err := scale.Each(n, 64, func(i int) error { return leases[i].Release(context.Background()) }); err != nil {
		b.Error(err)
	}
}
