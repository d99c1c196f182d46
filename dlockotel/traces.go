package dlockotel

import (
	"context"
	"math"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock"
)

// Span and span event names, as documented in the package comment.
const (
	SpanAcquire        = "dlock.acquire"
	SpanRelease        = "dlock.release"
	SpanLost           = "dlock.lost"
	SpanEventAttempt   = "dlock.attempt"
	SpanEventWaitStart = "dlock.wait.start"
	SpanEventWaitEnd   = "dlock.wait.end"
)

type tracing struct {
	tracer  trace.Tracer
	backend []attribute.KeyValue // the backend attribute, when named

	// acquired maps each held *dlock.Lease to its Acquire span's context,
	// so the release and lost spans can link to it. An entry is deleted
	// when the lease ends.
	acquired sync.Map
}

// spanKey is the context key of the Acquire span this tracing started. A
// private key (rather than trace.SpanFromContext) finds our span even if
// another observer put its own span in the context after ours.
type spanKey struct{ t *tracing }

// releaseKey is the context key of the Release span this tracing started.
type releaseKey struct{ t *tracing }

func newTracing(tp trace.TracerProvider, cfg options) *tracing {
	t := &tracing{tracer: tp.Tracer(ScopeName)}
	if cfg.backend != "" {
		t.backend = []attribute.KeyValue{AttrBackend.String(cfg.backend)}
	}
	return t
}

// span returns the Acquire span this tracing started in ctx, or nil.
func (t *tracing) span(ctx context.Context) trace.Span {
	s, _ := ctx.Value(spanKey{t}).(trace.Span)
	return s
}

// recording returns the Acquire span in ctx if it records events (it is
// sampled), or nil.
func (t *tracing) recording(ctx context.Context) trace.Span {
	if s := t.span(ctx); s != nil && s.IsRecording() {
		return s
	}
	return nil
}

func (t *tracing) observe(ctx context.Context, e dlock.Event) context.Context {
	switch e.Kind {
	case dlock.EventAcquireStart:
		attrs := append([]attribute.KeyValue{AttrKey.String(e.Key)}, t.backend...)
		ctx, s := t.tracer.Start(ctx, SpanAcquire, trace.WithAttributes(attrs...))
		return context.WithValue(ctx, spanKey{t}, s)
	case dlock.EventAttempt:
		if s := t.recording(ctx); s != nil {
			attrs := []attribute.KeyValue{AttrAttempt.Int(e.Attempt), AttrGranted.Bool(e.Granted)}
			if e.HolderTTL > 0 {
				attrs = append(attrs, AttrHolderTTL.Float64(e.HolderTTL.Seconds()))
			}
			if e.Err != nil {
				attrs = append(attrs, AttrError.String(e.Err.Error()))
			}
			s.AddEvent(SpanEventAttempt, trace.WithAttributes(attrs...))
		}
	case dlock.EventWaitStart:
		if s := t.recording(ctx); s != nil {
			s.AddEvent(SpanEventWaitStart)
		}
	case dlock.EventWaitEnd:
		if s := t.recording(ctx); s != nil {
			s.AddEvent(SpanEventWaitEnd)
		}
	case dlock.EventAcquireEnd:
		if s := t.span(ctx); s != nil {
			if s.IsRecording() {
				t.endAcquire(s, e)
			}
			s.End()
		}
	case dlock.EventReleaseStart:
		if e.Lease == nil {
			break
		}
		opts := []trace.SpanStartOption{trace.WithAttributes(append([]attribute.KeyValue{
			AttrKey.String(e.Key), fenceAttr(e.Lease.Fence())}, t.backend...)...)}
		if sc, ok := t.link(e.Lease); ok {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		ctx, s := t.tracer.Start(ctx, SpanRelease, opts...)
		return context.WithValue(ctx, releaseKey{t}, s)
	case dlock.EventReleased:
		s, _ := ctx.Value(releaseKey{t}).(trace.Span)
		if s == nil {
			break
		}
		if e.Lease != nil {
			t.link(e.Lease) // forget the acquire span once the lease ended
		}
		s.SetAttributes(AttrHeld.Float64(e.Duration.Seconds()))
		if e.Err != nil {
			s.RecordError(e.Err)
			s.SetStatus(codes.Error, e.Err.Error())
		}
		s.End()
	case dlock.EventLost:
		if e.Lease == nil {
			break
		}
		// A loss is found by the watchdog (or a backend's loss signal),
		// outside any caller's trace: the span is a new root, linked to
		// the Acquire span of the lease.
		attrs := t.leaseAttrs(e)
		opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithAttributes(attrs...)}
		if sc, ok := t.link(e.Lease); ok {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		_, s := t.tracer.Start(ctx, SpanLost, opts...)
		if e.Err != nil {
			s.RecordError(e.Err)
			s.SetStatus(codes.Error, e.Err.Error())
		}
		s.End()
	}
	return ctx
}

// endAcquire sets the outcome of the Acquire span s before it ends.
func (t *tracing) endAcquire(s trace.Span, e dlock.Event) {
	switch outcomeOf(e.Err) {
	case outAcquired:
		if l := e.Lease; l != nil {
			s.SetAttributes(AttrOutcome.String(OutcomeAcquired), fenceAttr(l.Fence()), AttrCount.Int(l.Count()))
			t.remember(l, s.SpanContext())
		} else {
			s.SetAttributes(AttrOutcome.String(OutcomeAcquired))
		}
	case outNotAcquired:
		s.SetAttributes(AttrOutcome.String(OutcomeNotAcquired))
		s.SetStatus(codes.Error, e.Err.Error())
	default:
		s.SetAttributes(AttrOutcome.String(OutcomeError))
		s.RecordError(e.Err)
		s.SetStatus(codes.Error, e.Err.Error())
	}
}

func (t *tracing) leaseAttrs(e dlock.Event) []attribute.KeyValue {
	return append([]attribute.KeyValue{
		AttrKey.String(e.Key),
		fenceAttr(e.Lease.Fence()),
		AttrHeld.Float64(e.Duration.Seconds()),
	}, t.backend...)
}

// remember records the Acquire span of a held lease for later links, if
// it was sampled (a link to a span that was not recorded leads nowhere).
func (t *tracing) remember(l *dlock.Lease, sc trace.SpanContext) {
	if !sc.IsSampled() {
		return
	}
	t.acquired.Store(l, sc)
	if l.Err() != nil {
		// Ended meanwhile (lost at once): its end may have looked up the
		// map before the Store; drop the entry so it does not stay.
		t.acquired.Delete(l)
	}
}

// link returns the Acquire span context of l, forgetting it once l has
// ended (a repeated Release finds nothing, and links nothing).
func (t *tracing) link(l *dlock.Lease) (trace.SpanContext, bool) {
	var v any
	var ok bool
	if l.Err() != nil {
		v, ok = t.acquired.LoadAndDelete(l)
	} else {
		v, ok = t.acquired.Load(l)
	}
	if !ok {
		return trace.SpanContext{}, false
	}
	return v.(trace.SpanContext), true
}

// fenceAttr returns the fence as an int64 attribute (OpenTelemetry has no
// unsigned integers), or as a decimal string in the unlikely case it does
// not fit.
func fenceAttr(f uint64) attribute.KeyValue {
	if f > math.MaxInt64 {
		return AttrFence.String(strconv.FormatUint(f, 10))
	}
	return AttrFence.Int64(int64(f))
}
