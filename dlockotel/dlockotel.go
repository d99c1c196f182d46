package dlockotel

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock"
)

// ScopeName is the instrumentation scope of the meter and the tracer
// dlockotel creates: the package's import path.
const ScopeName = "github.com/dlock-go/dlock/dlockotel"

// An Option configures the Observer built by NewObserver,
// WithMeterProvider or WithTracerProvider.
type Option func(*options)

type options struct {
	backend string
}

// WithBackendName sets the value of the dlock.backend attribute put on
// every metric point and span, e.g. "redis", "redlock", "etcd". Name the
// backend when one process uses several, so they can be told apart.
// Default: "" — the attribute is left out. The observer cannot learn the
// backend by itself: the core does not pass it in events.
func WithBackendName(name string) Option {
	return func(o *options) { o.backend = name }
}

// WithMeterProvider makes the Client record the metrics documented in the
// package comment with a meter from mp. Default (when not given): no
// metric is recorded. When mp is a no-op provider (package
// go.opentelemetry.io/otel/metric/noop) the option installs nothing, so
// the Client does no extra work at all. A nil mp is a
// dlock.ErrInvalidOption error, reported by dlock.New through
// Client.Err, as is a failure to create an instrument. The instruments
// are created by this call; the option may be given to several Clients,
// whose measurements then add up.
//
// To record metrics and traces with a single observer (one call per
// event, and metric exemplars linked to the Acquire span), use NewObserver
// with both providers and pass Observer.Option to dlock.New instead.
func WithMeterProvider(mp metric.MeterProvider, opts ...Option) dlock.Option {
	if mp == nil {
		return failOption(fmt.Errorf("dlockotel: %w: nil MeterProvider", dlock.ErrInvalidOption))
	}
	return observerOption(mp, nil, opts)
}

// WithTracerProvider makes the Client record the spans documented in the
// package comment with a tracer from tp. Default (when not given): no
// span is created, and an Acquire's context reaches the backend as the
// caller passed it. When tp is a no-op provider (package
// go.opentelemetry.io/otel/trace/noop) the option installs nothing. A nil
// tp is a dlock.ErrInvalidOption error, reported by dlock.New through
// Client.Err.
func WithTracerProvider(tp trace.TracerProvider, opts ...Option) dlock.Option {
	if tp == nil {
		return failOption(fmt.Errorf("dlockotel: %w: nil TracerProvider", dlock.ErrInvalidOption))
	}
	return observerOption(nil, tp, opts)
}

// observerOption returns the Option of NewObserver(mp, tp, opts...), or
// one that fails with NewObserver's error.
func observerOption(mp metric.MeterProvider, tp trace.TracerProvider, opts []Option) dlock.Option {
	o, err := NewObserver(mp, tp, opts...)
	if err != nil {
		return failOption(err)
	}
	return o.Option()
}

// Observer is a dlock.Observer that records OpenTelemetry metrics and
// traces of a Client's lock operations. Create it with NewObserver; it is
// safe for concurrent use and may be shared by several Clients (their
// measurements then add up, told apart only by WithBackendName).
type Observer struct {
	m *meters  // nil: no metrics
	t *tracing // nil: no traces
}

var _ dlock.Observer = (*Observer)(nil)

// NewObserver returns an Observer recording metrics with a meter from mp
// and spans with a tracer from tp. A nil or no-op provider (packages
// go.opentelemetry.io/otel/metric/noop and .../trace/noop) records
// nothing. It returns an error, matching dlock.ErrInvalidOption, only when
// mp fails to create an instrument.
func NewObserver(mp metric.MeterProvider, tp trace.TracerProvider, opts ...Option) (*Observer, error) {
	var cfg options
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	o := &Observer{}
	if mp != nil && !isNoopMeterProvider(mp) {
		m, err := newMeters(mp, cfg)
		if err != nil {
			return nil, fmt.Errorf("dlockotel: %w: %w", dlock.ErrInvalidOption, err)
		}
		o.m = m
	}
	if tp != nil && !isNoopTracerProvider(tp) {
		o.t = newTracing(tp, cfg)
	}
	return o, nil
}

// Enabled reports whether o records anything: false when both providers
// were nil or no-op.
func (o *Observer) Enabled() bool { return o != nil && (o.m != nil || o.t != nil) }

// Option returns the dlock.Option installing o on a Client:
// dlock.WithObserver(o), or, when o records nothing (Enabled is false), an
// option that installs nothing, so the Client keeps its observer-free
// fast path.
func (o *Observer) Option() dlock.Option {
	if !o.Enabled() {
		return nopOption
	}
	return dlock.WithObserver(o)
}

// Observe implements dlock.Observer. At EventAcquireStart it starts the
// Acquire span (when tracing) and returns the context carrying it; every
// other event returns ctx unchanged.
func (o *Observer) Observe(ctx context.Context, e dlock.Event) context.Context {
	if ctx == nil {
		// Lease.Release(nil) reports its ErrInvalidOption with a nil ctx.
		ctx = context.Background()
	}
	if o.t != nil {
		ctx = o.t.observe(ctx, e)
	}
	if o.m != nil {
		o.m.observe(ctx, e)
	}
	return ctx
}

// isNoopMeterProvider reports a provider known to record nothing.
func isNoopMeterProvider(mp metric.MeterProvider) bool {
	switch mp.(type) {
	case metricnoop.MeterProvider, *metricnoop.MeterProvider:
		return true
	}
	return false
}

// isNoopTracerProvider reports a provider known to create only
// non-recording spans that carry no span context.
func isNoopTracerProvider(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case tracenoop.TracerProvider, *tracenoop.TracerProvider:
		return true
	}
	return false
}

// dlock.Option is func(*dlock.config) error with an unexported config, so
// this package cannot spell an option's type. Type inference can: a
// generic function instantiated by assignment to dlock.Option (nopOption),
// or by passing a dlock.Option as a type witness (failOption). The
// alternative, dlock.WithObserver of an observer doing nothing, would cost
// the Client its observer-free fast path.

func nopApply[C any](C) error { return nil }

// nopOption is a dlock.Option that changes nothing.
var nopOption dlock.Option = nopApply

func failWith[C any](_ func(C) error, err error) func(C) error {
	return func(C) error { return err }
}

// failOption returns a dlock.Option whose application fails with err, so
// dlock.New reports err through Client.Err.
func failOption(err error) dlock.Option { return failWith(nopOption, err) }
