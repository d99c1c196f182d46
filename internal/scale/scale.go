// Package scale holds what the tests and benchmarks that take many locks
// share: a loop over indexes run by a fixed number of goroutines, and a
// sample of the process's memory to measure what each held lease costs.
package scale

import (
	"runtime"
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
