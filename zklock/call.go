package zklock

import (
	"context"
	"errors"
	"time"

	"github.com/go-zookeeper/zk"
)

// go-zookeeper has no context support: a call blocks until the server
// answers, the connection drops (ErrConnectionClosed), a reconnection
// round gives up (ErrNoServer, about once a second with one server) or the
// connection is closed. await bounds a call by ctx: when ctx ends first it
// returns ctx's error at once and leaves the call running on its own
// goroutine, which ends when go-zookeeper answers. For writes, the pending
// result is handed back so the caller can undo a write that lands late.

type result[T any] struct {
	v   T
	err error
}

// await runs f bounded by ctx (see above). It does not start f when ctx
// has already ended.
func await[T any](ctx context.Context, f func() (T, error)) (T, error) {
	v, _, err := awaitWrite(ctx, f)
	return v, err
}

// awaitWrite is await that also returns, when ctx ended first, the
// channel on which f's result will arrive.
func awaitWrite[T any](ctx context.Context, f func() (T, error)) (v T, pending <-chan result[T], err error) {
	if ctx.Done() == nil { // context.Background and friends: no goroutine needed
		v, err = f()
		return v, nil, err
	}
	if err := ctx.Err(); err != nil {
		return v, nil, err
	}
	ch := make(chan result[T], 1)
	go func() {
		v, err := f()
		ch <- result[T]{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, nil, r.err
	case <-ctx.Done():
		return v, ch, ctx.Err()
	}
}

// transient reports whether err says only that the connection failed
// while the session may live on: the request may or may not have been
// applied, and the same session can retry once reconnected.
func transient(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, zk.ErrSessionMoved)
}

// sleepCtx waits d or until ctx ends, and reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// backoff doubles d up to a second.
func backoff(d time.Duration) time.Duration { return min(2*d, time.Second) }
