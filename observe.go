package dlock

import (
	"context"
	"log/slog"
	"time"
)

// EventKind names what happened in an Event.
type EventKind uint8

// The events a Client reports to its observers.
const (
	// EventAcquireStart: Acquire or TryAcquire begins (Key set); AcquireMany
	// reports one acquisition per key. The context an observer returns is
	// used for the rest of the call, so a tracer can start a span here.
	EventAcquireStart EventKind = iota + 1
	// EventAttempt: one acquisition attempt ended (Attempt, Err; Granted
	// tells whether it won; HolderTTL when it lost to a holder).
	EventAttempt
	// EventWaitStart and EventWaitEnd bracket the time a caller waits for
	// a lock held elsewhere (between attempts, in a server-side queue, or
	// behind the first acquisition of the same WithOwner id).
	EventWaitStart
	EventWaitEnd
	// EventAcquireEnd: Acquire returned (Lease on success, else Err;
	// Duration is the time from start to return).
	EventAcquireEnd
	// EventRenewed: the watchdog renewed Lease (Err nil) or failed to (Err
	// set; the lease is lost only later, see EventLost).
	EventRenewed
	// EventLost: Lease was lost (Err matches ErrLost; Duration is how long
	// it was held).
	EventLost
	// EventReleased: Release ended, or Client.Close released a live lease
	// (Err, Duration is how long it was held).
	EventReleased
	// EventReleaseStart: Release, or Client.Close for a live lease, begins
	// (Lease set). The context an observer returns is used for the rest of
	// the call (the backend's Release and EventReleased), so a tracer can
	// start a span here.
	EventReleaseStart
)

var eventNames = [...]string{"", "acquire_start", "attempt", "wait_start", "wait_end", "acquire_end", "renewed", "lost", "released", "release_start"}

// String returns the event's snake_case name, e.g. "acquire_end".
func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event describes one thing that happened in a Client.
type Event struct {
	Kind      EventKind
	Key       string
	Lease     *Lease        // the lease concerned, when there is one
	Attempt   int           // EventAttempt: the attempt number, from 1
	Granted   bool          // EventAttempt: the attempt took the lock
	HolderTTL time.Duration // EventAttempt: the holder's remaining TTL, if known
	Duration  time.Duration // EventAcquireEnd: call duration; EventLost/EventReleased: hold time
	Err       error
}

// An Observer receives a Client's events, for metrics, traces and logs
// (package dlockotel adapts OpenTelemetry). Observe is called
// synchronously on the hot path: it must be fast and must not block; it
// may be called from several goroutines at once. It returns the context
// to continue with (ctx itself unless it starts a span).
type Observer interface {
	Observe(ctx context.Context, e Event) context.Context
}

// WithObserver adds o to the observers the Client reports events to, in
// order. Default none: with no observer the Client does no extra work. A
// nil o is an ErrInvalidOption error.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if o == nil {
			return errInvalid("nil Observer")
		}
		c.observers = append(c.observers[:len(c.observers):len(c.observers)], o)
		return nil
	}
}

// WithLogger logs lock events to l: lost leases and failed renewals at
// Warn, acquisition errors other than contention at Error, acquisitions,
// releases and contention at Debug. Default: silent. A nil l is an
// ErrInvalidOption error.
func WithLogger(l *slog.Logger) Option {
	if l == nil {
		return func(*config) error { return errInvalid("nil Logger") }
	}
	return WithObserver(logObserver{l})
}

type logObserver struct{ l *slog.Logger }

func (o logObserver) Observe(ctx context.Context, e Event) context.Context {
	switch e.Kind {
	case EventLost:
		o.l.LogAttrs(ctx, slog.LevelWarn, "dlock: lease lost", slog.String("key", e.Key),
			slog.Uint64("fence", e.Lease.Fence()), slog.Duration("held", e.Duration), slog.Any("err", e.Err))
	case EventRenewed:
		if e.Err != nil {
			o.l.LogAttrs(ctx, slog.LevelWarn, "dlock: renewal failed", slog.String("key", e.Key),
				slog.Time("expires", e.Lease.Expires()), slog.Any("err", e.Err))
		}
	case EventAcquireEnd:
		switch {
		case e.Err == nil:
			o.l.LogAttrs(ctx, slog.LevelDebug, "dlock: acquired", slog.String("key", e.Key),
				slog.Uint64("fence", e.Lease.Fence()), slog.Duration("took", e.Duration))
		case isNotAcquired(e.Err):
			o.l.LogAttrs(ctx, slog.LevelDebug, "dlock: not acquired", slog.String("key", e.Key), slog.Any("err", e.Err))
		default:
			o.l.LogAttrs(ctx, slog.LevelError, "dlock: acquire failed", slog.String("key", e.Key), slog.Any("err", e.Err))
		}
	case EventReleased:
		o.l.LogAttrs(ctx, slog.LevelDebug, "dlock: released", slog.String("key", e.Key),
			slog.Duration("held", e.Duration), slog.Any("err", e.Err))
	}
	return ctx
}

// observe reports e to the observers of cfg; it costs one length check
// when there are none.
func observe(ctx context.Context, obs []Observer, e Event) context.Context {
	for _, o := range obs {
		ctx = o.Observe(ctx, e)
	}
	return ctx
}
