package fence_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/dlock-go/dlock/fence"
)

func TestGuardRule(t *testing.T) {
	var g fence.Guard
	steps := []struct {
		fence uint64
		owner string
		ok    bool
	}{
		{5, "a", true},  // first write
		{5, "a", true},  // same lease writes again
		{5, "b", false}, // equal fence, other owner
		{4, "c", false}, // older fence
		{9, "d", true},  // newer fence
		{5, "a", false}, // the old lease after takeover
		{10, "a", true}, // a new lease of a
	}
	for i, s := range steps {
		err := g.Check("r", s.fence, s.owner)
		if (err == nil) != s.ok {
			t.Fatalf("step %d Check(%d, %s): got %v, want ok=%v", i, s.fence, s.owner, err, s.ok)
		}
		if err != nil && !errors.Is(err, fence.ErrStale) {
			t.Fatalf("step %d: got %v, want ErrStale", i, err)
		}
	}
	if got := g.Highest("r"); got != 10 {
		t.Fatalf("Highest: got %d, want 10", got)
	}
	if got := g.Highest("other"); got != 0 {
		t.Fatalf("Highest of an untouched resource: got %d, want 0", got)
	}
}

func TestGuardDoAtomic(t *testing.T) {
	var g fence.Guard
	var wg sync.WaitGroup
	var mu sync.Mutex
	var writes []uint64
	for f := uint64(1); f <= 100; f++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = g.Do("r", f, "o", func() error {
				mu.Lock()
				writes = append(writes, f)
				mu.Unlock()
				return nil
			})
		}()
	}
	wg.Wait()
	for i := 1; i < len(writes); i++ {
		if writes[i] <= writes[i-1] {
			t.Fatalf("accepted writes not increasing: %v", writes)
		}
	}
	errWrite := errors.New("disk full")
	if err := g.Do("r", 1000, "o", func() error { return errWrite }); !errors.Is(err, errWrite) {
		t.Fatalf("Do with a failing write: got %v", err)
	}
	if g.Highest("r") == 1000 {
		t.Fatal("a failed write recorded its fence")
	}
}

func TestSQLPredicate(t *testing.T) {
	if got, want := fence.SQLPredicate("fence", "$1"), "(fence IS NULL OR fence < $1)"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
