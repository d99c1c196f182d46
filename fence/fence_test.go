package fence_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

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

func TestTokenCompare(t *testing.T) {
	for _, tc := range []struct {
		a, b fence.Token
		want int
	}{
		{fence.Token{Fence: 1}, fence.Token{Fence: 2}, -1},
		{fence.Token{Fence: 2}, fence.Token{Fence: 2}, 0},
		{fence.Token{Epoch: 1, Fence: 1}, fence.Token{Fence: 1 << 62}, 1}, // a new epoch beats any older fence
		{fence.Token{Epoch: 1, Fence: 9}, fence.Token{Epoch: 2, Fence: 1}, -1},
	} {
		if got := tc.a.Compare(tc.b); got != tc.want {
			t.Errorf("%v.Compare(%v): got %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := tc.b.Compare(tc.a); got != -tc.want {
			t.Errorf("%v.Compare(%v): got %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
}

// A resource guarded with fences of one backend (large, time-based) moves
// to another backend whose fences start small: the new epoch's first write
// supersedes every old fence, and the old backend's holders are refused.
func TestGuardEpochSwitch(t *testing.T) {
	var g fence.Guard
	const oldFence = 1_764_000_000_000_000 // a Redis TIME-µs sized fence
	if err := g.Check("r", oldFence, "a"); err != nil {
		t.Fatal(err)
	}
	// Without an epoch the new backend's small fence is refused.
	if err := g.Check("r", 12, "b"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("small fence of the new backend without an epoch: got %v, want ErrStale", err)
	}
	steps := []struct {
		tok   fence.Token
		owner string
		ok    bool
	}{
		{fence.Token{Epoch: 1, Fence: 12}, "b", true},            // first write of epoch 1
		{fence.Token{Epoch: 0, Fence: oldFence + 1}, "a", false}, // a late writer of the old backend
		{fence.Token{Epoch: 1, Fence: 12}, "b", true},            // the same lease again
		{fence.Token{Epoch: 1, Fence: 12}, "c", false},           // equal token, other owner
		{fence.Token{Epoch: 1, Fence: 11}, "c", false},           // older fence of the same epoch
		{fence.Token{Epoch: 1, Fence: 13}, "c", true},            // newer fence of the same epoch
	}
	for i, s := range steps {
		err := g.CheckToken("r", s.tok, s.owner)
		if (err == nil) != s.ok {
			t.Fatalf("step %d CheckToken(%v, %s): got %v, want ok=%v", i, s.tok, s.owner, err, s.ok)
		}
		var se *fence.StaleError
		if err != nil && (!errors.As(err, &se) || se.HighestEpoch != 1 || se.Epoch != s.tok.Epoch) {
			t.Fatalf("step %d: got %v, want a StaleError naming both epochs", i, err)
		}
	}
	if got, want := g.HighestToken("r"), (fence.Token{Epoch: 1, Fence: 13}); got != want {
		t.Fatalf("HighestToken: got %v, want %v", got, want)
	}
	if got := g.Highest("r"); got != 13 {
		t.Fatalf("Highest: got %d, want 13", got)
	}
}

func TestSQLTokenPredicate(t *testing.T) {
	got := fence.SQLTokenPredicate("epoch", "fence", "$1", "$2")
	want := "(COALESCE(epoch, 0) < $1 OR (COALESCE(epoch, 0) = $1 AND (fence IS NULL OR fence < $2)))"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestStaleErrorMessage(t *testing.T) {
	plain := &fence.StaleError{Resource: "r", Fence: 4, Highest: 9}
	if got, want := plain.Error(), `dlock: fence: write to "r" with fence 4 rejected: fence 9 already accepted`; got != want {
		t.Errorf("plain: got %q, want %q", got, want)
	}
	epochs := &fence.StaleError{Resource: "r", Fence: 1 << 50, Highest: 12, HighestEpoch: 1}
	if got, want := epochs.Error(), `dlock: fence: write to "r" with epoch 0 fence 1125899906842624 rejected: epoch 1 fence 12 already accepted`; got != want {
		t.Errorf("with epochs: got %q, want %q", got, want)
	}
}

// TestGuardDoPerResource: a write in progress holds its resource only:
// Do on another resource and HighestToken do not wait for it, Do on the
// same resource does.
func TestGuardDoPerResource(t *testing.T) {
	var g fence.Guard
	started, release := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		firstDone <- g.Do("a", 1, "o", func() error {
			close(started)
			<-release
			return nil
		})
	}()
	<-started
	sameDone := make(chan error, 1)
	go func() { sameDone <- g.Do("a", 2, "o", func() error { return nil }) }()
	otherDone := make(chan error, 1)
	go func() { otherDone <- g.Do("b", 1, "o", func() error { return nil }) }()
	highest := make(chan fence.Token, 1)
	go func() { highest <- g.HighestToken("a") }()

	var failure error
	deadline := make(chan struct{}) // closed after 10 s
	timer := time.AfterFunc(10*time.Second, func() { close(deadline) })
	defer timer.Stop()
	otherWaited, highestWaited := false, false
	select {
	case err := <-otherDone:
		failure = err
	case <-deadline:
		otherWaited = true
		failure = errors.New("Do on resource b waited for a write to resource a")
	}
	select {
	case got := <-highest:
		if got != (fence.Token{}) {
			failure = errors.Join(failure, fmt.Errorf("HighestToken(a) during its first write: got %v, want none", got))
		}
	case <-deadline:
		highestWaited = true
		failure = errors.Join(failure, errors.New("HighestToken(a) waited for a write to resource a"))
	}
	sameWaited := true
	select {
	case err := <-sameDone:
		sameWaited = false
		failure = errors.Join(failure, fmt.Errorf("Do on resource a returned %v during another write to a", err))
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	failure = errors.Join(failure, <-firstDone)
	if sameWaited {
		failure = errors.Join(failure, <-sameDone)
	}
	if otherWaited {
		failure = errors.Join(failure, <-otherDone)
	}
	if highestWaited {
		<-highest
	}
	if failure != nil {
		t.Fatal(failure)
	}
	if got := g.Highest("a"); got != 2 {
		t.Fatalf("Highest(a): got %d, want 2", got)
	}
	// A failed first write records nothing: another owner's equal fence is
	// the resource's first write.
	if err := g.Do("c", 5, "x", func() error { return errors.New("disk full") }); err == nil {
		t.Fatal("Do with a failing write: got nil")
	}
	if err := g.Check("c", 5, "y"); err != nil {
		t.Fatalf("Check after a failed first write: %v", err)
	}
}

// TestSQLPlaceholders: the placeholder counts the doc comments state.
func TestSQLPlaceholders(t *testing.T) {
	if got := strings.Count(fence.SQLPredicate("fence", "?"), "?"); got != 1 {
		t.Errorf("SQLPredicate holds the placeholder %d times, want 1", got)
	}
	tok := fence.SQLTokenPredicate("epoch", "fence", "?E", "?F")
	if got := strings.Count(tok, "?"); got != 3 {
		t.Errorf("SQLTokenPredicate holds %d placeholders, want 3", got)
	}
	// In order: the epoch twice, then the fence.
	var order []string
	for s := tok; strings.Contains(s, "?"); {
		i := strings.Index(s, "?")
		order = append(order, s[i:i+2])
		s = s[i+2:]
	}
	if got := strings.Join(order, " "); got != "?E ?E ?F" {
		t.Errorf("SQLTokenPredicate placeholder order: got %s, want ?E ?E ?F", got)
	}
}
