// Package scale holds what the tests and benchmarks that take many locks
// share: a loop over indexes run by a fixed number of goroutines, a sample
// of the process's memory to measure what each held lease costs, and a
// count of the requests a client sends.
package scale

import (
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
)

// Each calls fn(i) for every i in [0, n), from at most workers goroutines
// at once, and returns when every call has returned. It returns the first
// error a call returned, or nil; the other calls still run.
func Each(n, workers int, fn func(i int) error) error {
	var (
		next  atomic.Int64
		first atomic.Pointer[error]
		wg    sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					first.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	wg.Wait()
	if p := first.Load(); p != nil {
		return *p
	}
	return nil
}

// Mem is a sample of the process's memory.
type Mem struct {
	Heap       uint64 // bytes of live heap objects (after two collections)
	Stack      uint64 // bytes of goroutine stacks in use
	Goroutines int
}

// Sample collects garbage twice, so that what the last collection freed is
// swept, and returns the memory in use.
func Sample() Mem {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return Mem{Heap: ms.HeapAlloc, Stack: ms.StackInuse, Goroutines: runtime.NumGoroutine()}
}

// PerItem returns the growth of heap and stack bytes from m0 to m1 per
// item of n (negative when memory shrank).
func PerItem(m0, m1 Mem, n int) (heap, stack float64) {
	return float64(int64(m1.Heap)-int64(m0.Heap)) / float64(n), float64(int64(m1.Stack)-int64(m0.Stack)) / float64(n)
}

// CountRequests wraps conn so that n counts the requests sent on it. A
// request is a burst of bytes written after the last read that returned
// data (or the first write): one command, one pipeline however many
// writes its buffer needs, one SUBSCRIBE. Bytes the server pushes are
// reads and never count, so on a request-reply protocol this counts the
// round trips.
func CountRequests(conn net.Conn, n *atomic.Int64) net.Conn {
	c := &countConn{Conn: conn, n: n}
	c.reading.Store(true)
	return c
}

type countConn struct {
	net.Conn
	n       *atomic.Int64
	reading atomic.Bool // the last I/O with data was a read, or there was none yet
}

func (c *countConn) Write(p []byte) (int, error) {
	if c.reading.Swap(false) {
		c.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.reading.Store(true)
	}
	return n, err
}

// LoadAvg returns the machine's 1, 5 and 15 minute load averages as
// "1.02, 0.88, 0.75", or "unknown" where /proc/loadavg cannot be read.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}
