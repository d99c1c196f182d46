package zklock_test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/locktest/handoff"
	"github.com/dlock-go/dlock/zklock"
	"github.com/go-zookeeper/zk"
)

// BenchmarkHandoff measures lock hand-offs per second with n goroutines
// contending for one key, each with its own session (zklock: its own
// connection, Backend and dlock.Client; the peer: its own connection and
// go-zookeeper's zk.Lock), each holding the lock about 100µs (locktest.Hold), in
// package handoff's interleaved slices. The sets: zklock as in production
// and without watching the node ahead of the predecessor; then the peer.
// Reported per grant besides the rates: the server's requests, fsyncs of
// its transaction log and their time (mntr), and the CPU time of the
// server and of the clients' process.
//
//	go test -run '^$' -bench Handoff -benchtime 1x
//
// TMPDIR=/dev/shm puts the server's data directory on tmpfs, which takes a
// disk shared with other work out of the comparison (an additional
// figure, not a replacement).
func BenchmarkHandoff(b *testing.B) { handoff.Run(b, benchHandoff) }

func benchHandoff(b *testing.B, workers int) {
	const (
		hold    = 100 * time.Microsecond
		slice   = 250 * time.Millisecond
		rounds  = 40
		session = 10 * time.Second
	)
	key := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	newOurs := func(ahead bool) *handoff.Metered[zkMetrics] {
		return locktest.Contenders(workers, hold, func() handoff.Worker {
			_, be, err := zklock.Connect([]string{zkServer.Addr()}, session, zklock.WithLogger(quiet{}))
			if err != nil {
				b.Fatal(err)
			}
			be.SetWatchAhead(ahead)
			return handoff.ClientWorker(b, dlock.New(be, dlock.WithTTL(session)), key)
		}, scrape, (*zkMetrics).add)
	}
	// The sets take turns, in a rotating order: zklock as in production,
	// zklock without watching the node ahead of the predecessor (what that
	// saves), and the peer.
	sets := []*handoff.Metered[zkMetrics]{newOurs(true), newOurs(false), locktest.Contenders(workers, hold, func() handoff.Worker {
		conn, _, err := zk.Connect([]string{zkServer.Addr()}, session, zk.WithLogger(quiet{}))
		if err != nil {
			b.Fatal(err)
		}
		zl := zk.NewLock(conn, "/zklock-bench/"+key, zk.WorldACL(zk.PermAll))
		return locktest.PeerWorker(b, zl.Lock, zl.Unlock, conn.Close)
	}, scrape, (*zkMetrics).add)}
	names := []string{"zklock", "zklock (no watch ahead)", "zk.Lock"}
	for _, c := range sets {
		defer c.Close()
	}
	rates, ratios := handoff.Compare(b, names, sets, rounds, slice, (*zkMetrics).per)
	b.ReportMetric(handoff.Median(rates[0]), "zklock-handoffs/s")
	b.ReportMetric(handoff.Median(rates[len(sets)-1]), "zk.Lock-handoffs/s")
	b.ReportMetric(handoff.Median(ratios[0]), "median-ratio")
	b.ReportMetric(handoff.Median(ratios[1]), "noahead-median-ratio")
	b.ReportMetric(sets[0].Srv.requests/float64(max(sets[0].Total, 1)), "zklock-reqs/op")
	b.ReportMetric(sets[1].Srv.requests/float64(max(sets[1].Total, 1)), "noahead-reqs/op")
	b.ReportMetric(sets[2].Srv.requests/float64(max(sets[2].Total, 1)), "zk.Lock-reqs/op")
}

// zkMetrics are counters of the ZooKeeper server (four-letter word mntr)
// and CPU times.
type zkMetrics struct {
	requests float64      // packets received (requests and pings)
	fsyncs   float64      // transaction log fsyncs
	fsyncMs  float64      // milliseconds spent in them
	cpu      locktest.CPU // of the server (the JVM) and the clients'
}

// scrape reads the test server's counters; on failure the figures are
// zero (they are informative only).
func scrape() zkMetrics {
	m := zkMetrics{cpu: locktest.SampleCPU(zkServer.PID())}
	conn, err := net.DialTimeout("tcp", zkServer.Addr(), 5*time.Second)
	if err != nil {
		return m
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("mntr")); err != nil {
		return m
	}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), "\t")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		switch name {
		case "zk_packets_received":
			m.requests = v
		case "zk_cnt_fsynctime":
			m.fsyncs = v
		case "zk_sum_fsynctime":
			m.fsyncMs = v
		}
	}
	return m
}

// add adds the difference after − before to m.
func (m *zkMetrics) add(after, before zkMetrics) {
	m.requests += after.requests - before.requests
	m.fsyncs += after.fsyncs - before.fsyncs
	m.fsyncMs += after.fsyncMs - before.fsyncMs
	m.cpu.Add(after.cpu, before.cpu)
}

// per formats m divided by n grants.
func (m *zkMetrics) per(n int64) string {
	if n == 0 {
		return "no grants"
	}
	f := float64(n)
	return fmt.Sprintf("requests %.2f, fsyncs %.2f, fsync %.3f ms, CPU ms: server %.2f, clients %.2f",
		m.requests/f, m.fsyncs/f, m.fsyncMs/f, m.cpu.Server*1e3/f, m.cpu.Clients*1e3/f)
}
