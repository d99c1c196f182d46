package locktest

import (
	"testing"

	"github.com/dlock-go/dlock/internal/locktest/handoff"
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
