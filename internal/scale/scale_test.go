package scale_test

import (
	"errors"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock/internal/scale"
)

func TestEach(t *testing.T) {
	const n = 1000
	var seen [n]atomic.Int32
	var running, most atomic.Int32
	err := scale.Each(n, 8, func(i int) error {
		r := running.Add(1)
		for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
		}
		seen[i].Add(1)
		running.Add(-1)
		return nil
	})
	if err != nil {
		t.Fatalf("got %v, want nil", err)
	}
	for i := range seen {
		if got := seen[i].Load(); got != 1 {
			t.Fatalf("index %d: called %d times, want 1", i, got)
		}
	}
	if m := most.Load(); m > 8 {
		t.Errorf("got %d calls at once, want at most 8", m)
	}
}

func TestEachError(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int32
	err := scale.Each(100, 4, func(i int) error {
		calls.Add(1)
		if i%10 == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("got %v, want %v", err, boom)
	}
	if got := calls.Load(); got != 100 {
		t.Errorf("got %d calls, want 100: the others still run", got)
	}
	if err := scale.Each(0, 4, func(int) error { return boom }); err != nil {
		t.Errorf("n = 0: got %v, want nil", err)
	}
}

func TestSample(t *testing.T) {
	m0 := scale.Sample()
	// Enough buffers that other garbage freed between the samples (a few
	// KiB) moves the figure by less than a byte.
	keep := make([][]byte, 10000)
	for i := range keep {
		keep[i] = make([]byte, 1024)
	}
	m1 := scale.Sample()
	heap, _ := scale.PerItem(m0, m1, len(keep))
	if heap < 1016 || heap > 2048 {
		t.Errorf("got %.1f heap bytes per 1 KiB buffer, want 1016–2048", heap)
	}
	if m1.Goroutines < 1 {
		t.Errorf("got %d goroutines, want at least 1", m1.Goroutines)
	}
	runtime.KeepAlive(keep)
}

func TestCountRequests(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var n atomic.Int64
	c := scale.CountRequests(a, &n)
	go func() {
		buf := make([]byte, 16)
		for {
			k, err := b.Read(buf)
			if err != nil {
				return
			}
			if string(buf[:k]) == "end" {
				b.Write([]byte("ok"))
			}
		}
	}()
	// Two writes before a reply: one request. Then a reply, then another
	// request.
	for _, w := range []string{"a", "b", "end"} {
		if _, err := c.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Read(make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("c")); err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != 2 {
		t.Errorf("got %d requests, want 2", got)
	}
}

func TestLoadAvg(t *testing.T) {
	got := scale.LoadAvg()
	if runtime.GOOS != "linux" {
		t.Skipf("no /proc/loadavg on %s (got %q)", runtime.GOOS, got)
	}
	if f := strings.Split(got, ", "); len(f) != 3 {
		t.Errorf("got %q, want three load averages", got)
	}
}
