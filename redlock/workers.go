package redlock

import (
	"sync"
	"time"
)

// workerIdle is how long a fan-out worker waits for its next call before
// it exits.
const workerIdle = 50 * time.Millisecond

// workers runs the calls of fan-outs on goroutines that outlive one call:
// a goroutine that has run a node call has grown its stack to what go-redis
// needs, and a new one per call would grow it again (a measured tenth of
// the client's CPU time in an uncontended loop). An idle worker waits
// workerIdle for another call, then exits, so a Backend left alone holds
// no goroutine.
type workers struct {
	mu   sync.Mutex
	idle []chan func() // parked workers, each waiting on its channel
}

// run calls fn on an idle worker, or on a new one.
func (w *workers) run(fn func()) {
	w.mu.Lock()
	if n := len(w.idle); n > 0 {
		c := w.idle[n-1]
		w.idle = w.idle[:n-1]
		w.mu.Unlock()
		c <- fn // buffered: never blocks
		return
	}
	w.mu.Unlock()
	go w.work(fn)
}

// work runs fn, then the calls handed to it, until it has been idle for
// workerIdle.
func (w *workers) work(fn func()) {
	c := make(chan func(), 1)
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		fn()
		w.mu.Lock()
		w.idle = append(w.idle, c)
		w.mu.Unlock()
		t.Reset(workerIdle)
		select {
		case fn = <-c:
			continue
		case <-t.C:
		}
		w.mu.Lock()
		for i, ic := range w.idle {
			if ic == c {
				w.idle = append(w.idle[:i], w.idle[i+1:]...)
				w.mu.Unlock()
				return
			}
		}
		w.mu.Unlock()
		fn = <-c // taken off the list by run: its call is on its way
	}
}
