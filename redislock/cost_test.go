package redislock_test

import (
	"os"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// cost measures what a benchmark loop spends besides wall time: the CPU
// time of this test process (every goroutine, GC included) and of the
// redis-server process (every thread: commands, scripts, network I/O;
// testserver.CPUTime),
// reported per operation as client-cpu-µs and server-cpu-µs. On a shared
// machine these move far less with the load than ns/op: they count work,
// not waiting. Both read 0 where the operating system does not tell
// (outside Linux).
type cost struct {
	pid         int
	client, srv time.Duration
}

func startCost(b *testing.B) *cost {
	b.Helper()
	pid := srv.PID()
	return &cost{pid: pid, client: testserver.CPUTime(os.Getpid()), srv: testserver.CPUTime(pid)}
}

// report adds the metrics for the b.N operations since startCost.
func (c *cost) report(b *testing.B) {
	b.Helper()
	client := testserver.CPUTime(os.Getpid()) - c.client
	server := testserver.CPUTime(c.pid) - c.srv
	b.ReportMetric(float64(client.Nanoseconds())/1e3/float64(b.N), "client-cpu-µs")
	b.ReportMetric(float64(server.Nanoseconds())/1e3/float64(b.N), "server-cpu-µs")
}
