package ctxend

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// lateCtx is a context past its deadline whose Done is closed only when
// the test says so, as a context is in the moment before its timer fires.
type lateCtx struct {
	context.Context
	deadline time.Time
	done     chan struct{}
}

func (c *lateCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *lateCtx) Done() <-chan struct{}       { return c.done }
func (c *lateCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func TestEnded(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	future, stop := context.WithTimeout(context.Background(), time.Hour)
	defer stop()
	late := &lateCtx{Context: context.Background(), deadline: time.Now().Add(-time.Millisecond), done: make(chan struct{})}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"no deadline", context.Background(), false},
		{"cancelled", cancelled, true},
		{"deadline ahead", future, false},
		{"deadline passed, timer not fired", late, true},
	} {
		if got := Ended(tc.ctx); got != tc.want {
			t.Errorf("%s: Ended = %v, want %v", tc.name, got, tc.want)
		}
		if tc.ctx == late {
			continue // Err waits for its timer: TestErrWaitsForTheTimer
		}
		if err := Err(tc.ctx); err != tc.ctx.Err() {
			t.Errorf("%s: Err = %v, want ctx.Err() (%v)", tc.name, err, tc.ctx.Err())
		}
	}
}

// TestErrWaitsForTheTimer: past its deadline, Err returns only once the
// context's Done is closed, with the context's own error.
func TestErrWaitsForTheTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		late := &lateCtx{Context: context.Background(), deadline: time.Now().Add(-time.Millisecond), done: make(chan struct{})}
		got := make(chan error, 1)
		go func() { got <- Err(late) }()
		synctest.Wait()
		select {
		case err := <-got:
			t.Fatalf("Err returned %v before the context's timer fired", err)
		default:
		}
		close(late.done)
		if err := <-got; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err: got %v, want DeadlineExceeded", err)
		}
	})
}
