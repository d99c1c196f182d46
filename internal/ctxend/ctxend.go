// Package ctxend tells whether a call failed because its context ended.
// A read deadline or a server can report a context's deadline a moment
// before the context's own timer fires, while ctx.Err() is still nil; a
// call that failed then must report the context's error all the same.
package ctxend

import (
	"context"
	"time"
)

// Ended reports whether ctx is done or its deadline has passed.
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// Err returns ctx's error when ctx has ended (Ended), else nil. Past its
// deadline it waits for ctx's timer, which fires at once, so that the
// caller finds ctx.Err() set too.
func Err(ctx context.Context) error {
	if !Ended(ctx) {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}
