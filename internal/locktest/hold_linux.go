//go:build linux

package locktest

import (
	"syscall"
	"time"
)

// Hold blocks the calling goroutine for about d (d plus the kernel's
// timer slack, 50µs by default): the work a benchmark or test does while
// it holds a lock. Not time.Sleep, which the Go runtime rounds up to its
// netpoller's millisecond when no other goroutine is runnable, so that a
// 100µs hold would last 0.1 to 1.1 ms depending on what else the process
// does. nanosleep blocks the thread (the runtime hands its P to other
// goroutines) and wakes on the kernel's high-resolution timer.
func Hold(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
