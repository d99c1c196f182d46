//go:build unix

package redislock_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// cost measures what a benchmark loop spends besides wall time: the
// client process's CPU time (getrusage: this test binary, every goroutine,
// GC included) and the server's (INFO commandstats: the usec of every
// command, summed), reported per operation as client-cpu-µs and
// server-µs. On a shared machine these move far less with the load than
// ns/op: they count work, not waiting.
type cost struct {
	rdb    *redis.Client
	cpu    time.Duration
	server int64
}

func startCost(b *testing.B, rdb *redis.Client) *cost {
	b.Helper()
	if err := rdb.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	return &cost{rdb: rdb, cpu: processCPU(b), server: serverUsec(b, rdb)}
}

// report adds the metrics for the b.N operations since startCost.
func (c *cost) report(b *testing.B) {
	b.Helper()
	cpu := processCPU(b) - c.cpu
	server := serverUsec(b, c.rdb) - c.server
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "client-cpu-µs")
	b.ReportMetric(float64(server)/float64(b.N), "server-µs")
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverUsec sums the usec= field of every cmdstat_ line of INFO
// commandstats.
func serverUsec(b *testing.B, rdb *redis.Client) int64 {
	stats, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(stats, "\n") {
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		_, rest, ok := strings.Cut(line, ",usec=")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(rest, ",")
		u, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("commandstats line %q: %v", line, err)
		}
		n += u
	}
	return n
}
