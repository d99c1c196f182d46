//go:build linux

package zklock_test

import (
	"syscall"
	"time"
)

// holdFor blocks the calling goroutine for about d (d plus the kernel's
// timer slack, 50µs by default). Not time.Sleep: the Go runtime rounds a
// sleep up to its netpoller's millisecond when no other goroutine is
// runnable, so a 100µs sleep lasts 0.1 to 1.1 ms depending on what else
// the process does — a wait that varies with the protocol being measured.
// nanosleep blocks the thread (the runtime hands its P to other goroutines)
// and wakes on the kernel's high-resolution timer.
func holdFor(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
