package redlock_test

import (
	"net"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/locktest"
)

// startDelayProxy returns the address of a proxy to target that delays
// every chunk of bytes by delay in each direction: the one-way latency of
// a network, which loopback lacks (tc netem is not available here). It
// stops when the test ends.
func startDelayProxy(t testing.TB, target string, delay time.Duration) string {
	t.Helper()
	return locktest.StartProxy(t, target, nil, func(c, s net.Conn) (up, down func()) {
		return func() { delayCopy(s, c, delay) }, func() { delayCopy(c, s, delay) }
	}).Addr()
}

// delayCopy copies src to dst, each chunk delayed by delay after it was
// read, until src ends or dst fails; it closes dst then.
func delayCopy(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range ch {
			time.Sleep(time.Until(c.at)) // the fault: the proxy's delay
			if _, err := dst.Write(c.b); err != nil {
				break
			}
		}
		dst.Close()
		for range ch {
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(delay)}
		}
		if err != nil {
			break
		}
	}
	close(ch)
	<-done
}
