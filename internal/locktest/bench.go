package locktest

import (
	"os"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/locktest/handoff"
	"github.com/dlock-go/dlock/internal/testserver"
)

// PeerWorker returns a hand-off benchmark worker for a peer library's lock:
// its Lock and Unlock call lock and unlock and report their errors to tb,
// its Close calls close.
func PeerWorker(tb testing.TB, lock, unlock func() error, close func()) handoff.Worker {
	return handoff.Worker{
		Lock: func() {
			if err := lock(); err != nil {
				tb.Error(err)
			}
		},
		Unlock: func() {
			if err := unlock(); err != nil {
				tb.Error(err)
			}
		},
		Close: close,
	}
}

// Contenders returns a hand-off benchmark set of n workers made by
// newWorker, each holding the lock for hold (Hold), with the server
// counters M that scrape reads and add sums over its runs (see
// handoff.NewMetered), starting from M's zero value.
func Contenders[M any](n int, hold time.Duration, newWorker func() handoff.Worker, scrape func() M, add func(sum *M, after, before M)) *handoff.Metered[M] {
	var zero M
	return handoff.NewMetered(handoff.NewSet(n, func() { Hold(hold) }, newWorker), zero, scrape, add)
}

// CPU is the CPU time, in seconds, of a server process and of this (the
// clients') process.
type CPU struct{ Server, Clients float64 }

// SampleCPU returns the CPU time process pid and this process have used
// (testserver.CPUTime; 0 outside Linux).
func SampleCPU(pid int) CPU {
	return CPU{Server: testserver.CPUTime(pid).Seconds(), Clients: testserver.CPUTime(os.Getpid()).Seconds()}
}

// Add adds the difference after − before to c.
func (c *CPU) Add(after, before CPU) {
	c.Server += after.Server - before.Server
	c.Clients += after.Clients - before.Clients
}
