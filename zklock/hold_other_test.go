//go:build !linux

package zklock_test

import (
	"runtime"
	"time"
)

// holdFor blocks the calling goroutine for about d, yielding meanwhile.
// Not time.Sleep, whose sub-millisecond waits the Go runtime may round up
// to a millisecond (see the Linux version).
func holdFor(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}
