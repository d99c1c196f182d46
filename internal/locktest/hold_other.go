//go:build !linux

package locktest

import (
	"runtime"
	"time"
)

// Hold blocks the calling goroutine for about d, yielding meanwhile: the
// work a benchmark or test does while it holds a lock (see the Linux
// version for why not time.Sleep).
func Hold(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}
