// Package release holds what the framework adapters share about giving a
// lock back.
package release

import (
	"context"
	"time"
)

// Context returns the context a release on behalf of a framework runs
// under: ctx bounded by d while ctx has a deadline and has not ended (the
// caller's bound is kept), else a context with ctx's values, not its
// cancellation, bounded by d. Frameworks unlock with contexts that never
// end (context.WithoutCancel) or that end at shutdown, when the lock must
// still be given back.
func Context(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok && ctx.Err() == nil {
		return context.WithTimeout(ctx, d)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
