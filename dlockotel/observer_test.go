package dlockotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/memlock"
)

// faulty is a memlock backend (real lock semantics) that fails the calls
// it is told to with the errors a multi-node backend such as Redlock
// returns: *dlock.NodeError values joined with errors.Join. It stands in
// for Redlock, which has no implementation yet; every other test runs on
// a real backend.
type faulty struct {
	*memlock.Backend

	mu         sync.Mutex
	acquireErr error
	refreshErr error
	releaseErr error
	acquireCtx []trace.SpanContext // span in the ctx of each TryAcquire
}

func (f *faulty) set(p *error, err error) {
	f.mu.Lock()
	*p = err
	f.mu.Unlock()
}

func (f *faulty) get(p *error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return *p
}

func (f *faulty) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	f.mu.Lock()
	f.acquireCtx = append(f.acquireCtx, spanOf(ctx))
	f.mu.Unlock()
	if err := f.get(&f.acquireErr); err != nil {
		return dlock.Grant{}, err
	}
	return f.Backend.TryAcquire(ctx, r)
}

func (f *faulty) Refresh(ctx context.Context, r dlock.Request) error {
	if err := f.get(&f.refreshErr); err != nil {
		return err
	}
	return f.Backend.Refresh(ctx, r)
}

func (f *faulty) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	errs := make([]error, len(rs))
	for i, r := range rs {
		errs[i] = f.Refresh(ctx, r)
	}
	return errs
}

func (f *faulty) Release(ctx context.Context, r dlock.Request) error {
	err := f.Backend.Release(ctx, r)
	if ferr := f.get(&f.releaseErr); ferr != nil {
		return ferr
	}
	return err
}

func nodeErr(node string, err error) error { return &dlock.NodeError{Node: node, Err: err} }

func TestNodeErrors(t *testing.T) {
	tm := newTelemetry(t)
	f := &faulty{Backend: memlock.New()}
	c := dlock.New(f, dlock.WithTTL(time.Second), dlockotel.WithMeterProvider(tm.mp))
	t.Cleanup(func() { c.Close() })
	ctx := ctxT(t, 10*time.Second)
	key := uniqueKey(t)

	// Two nodes fail an attempt: one point per node.
	f.set(&f.acquireErr, fmt.Errorf("redlock: no quorum: %w", errors.Join(nodeErr("n1", io.EOF), nodeErr("n2", context.DeadlineExceeded))))
	if _, err := c.TryAcquire(ctx, key); err == nil || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire: got %v, want the injected error", err)
	}
	wantSum(t, tm, dlockotel.MetricAcquisitions, 1, outcome("error"))
	wantSum(t, tm, dlockotel.MetricNodeErrors, 1, dlockotel.AttrNode.String("n1"), dlockotel.AttrOperation.String("acquire"))
	wantSum(t, tm, dlockotel.MetricNodeErrors, 1, dlockotel.AttrNode.String("n2"), dlockotel.AttrOperation.String("acquire"))
	f.set(&f.acquireErr, nil)

	// A renewal fails on one node, then succeeds again.
	l := locktest.MustAcquire(t, ctx, c, key)
	f.set(&f.refreshErr, nodeErr("n3", io.ErrUnexpectedEOF))
	eventually(t, "a failed renewal", func() bool { return tm.sum(t, dlockotel.MetricRenewalFailures) >= 1 })
	f.set(&f.refreshErr, nil)
	// One node error per failed renewal (once the last one in flight is in).
	eventually(t, "one node error per failed renewal", func() bool {
		n := tm.sum(t, dlockotel.MetricNodeErrors, dlockotel.AttrNode.String("n3"), dlockotel.AttrOperation.String("renew"))
		return n >= 1 && n == tm.sum(t, dlockotel.MetricRenewalFailures)
	})
	eventually(t, "a renewal", func() bool { return tm.sum(t, dlockotel.MetricRenewals) >= 1 })

	// A release fails on two nodes: the lease still ends.
	f.set(&f.releaseErr, errors.Join(nodeErr("n1", io.EOF), fmt.Errorf("wrapped: %w", nodeErr("n3", io.EOF))))
	if err := l.Release(ctx); err == nil || errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Release: got %v, want the injected error", err)
	}
	wantSum(t, tm, dlockotel.MetricNodeErrors, 1, dlockotel.AttrNode.String("n1"), dlockotel.AttrOperation.String("release"))
	wantSum(t, tm, dlockotel.MetricNodeErrors, 1, dlockotel.AttrNode.String("n3"), dlockotel.AttrOperation.String("release"))
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0)
	wantCount(t, tm, dlockotel.MetricHoldDuration, 1, outcome("released"))
	wantSum(t, tm, dlockotel.MetricLeasesLost, 0)
}

// The backend receives the Acquire span in its context, so spans of an
// instrumented driver nest under it.
func TestSpanReachesBackend(t *testing.T) {
	tm := newTelemetry(t)
	f := &faulty{Backend: memlock.New()}
	o, err := dlockotel.NewObserver(tm.mp, tm.tp)
	if err != nil {
		t.Fatalf("NewObserver: %v", err)
	}
	if !o.Enabled() {
		t.Fatal("Enabled with SDK providers: got false, want true")
	}
	c := dlock.New(f, o.Option())
	t.Cleanup(func() { c.Close() })
	key := uniqueKey(t)
	l, err := c.Acquire(ctxT(t, 10*time.Second), key)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	acq := onlySpan(t, tm, dlockotel.SpanAcquire, key)
	f.mu.Lock()
	got := f.acquireCtx
	f.mu.Unlock()
	if len(got) != 1 || !got[0].Equal(acq.SpanContext()) {
		t.Fatalf("span in the backend's ctx: got %v, want the acquire span %v", got, acq.SpanContext())
	}
	// One observer records both: metrics without a backend attribute.
	wantSum(t, tm, dlockotel.MetricAcquisitions, 1, outcome("acquired"))
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// Another observer that puts its own span in the context after ours does
// not make ours end elsewhere.
func TestForeignSpanInContext(t *testing.T) {
	tm := newTelemetry(t)
	other := newTelemetry(t)
	var foreign trace.Span
	c := dlock.New(memlock.New(),
		dlockotel.WithTracerProvider(tm.tp),
		dlock.WithObserver(observerFunc(func(ctx context.Context, e dlock.Event) context.Context {
			if e.Kind == dlock.EventAcquireStart {
				ctx, foreign = other.tp.Tracer("other").Start(ctx, "foreign")
			}
			return ctx
		})))
	t.Cleanup(func() { c.Close() })
	key := uniqueKey(t)
	if _, err := c.Acquire(ctxT(t, 10*time.Second), key); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	foreign.End()
	s := onlySpan(t, tm, dlockotel.SpanAcquire, key)
	wantAttrs(t, s, outcome("acquired"))
	if len(s.Events()) != 1 {
		t.Fatalf("acquire span events: got %v, want one attempt", eventNames(s.Events()))
	}
}

type observerFunc func(context.Context, dlock.Event) context.Context

func (f observerFunc) Observe(ctx context.Context, e dlock.Event) context.Context { return f(ctx, e) }

func TestNilProviders(t *testing.T) {
	for name, opt := range map[string]dlock.Option{
		"WithMeterProvider(nil)":  dlockotel.WithMeterProvider(nil),
		"WithTracerProvider(nil)": dlockotel.WithTracerProvider(nil),
	} {
		err := dlock.New(memlock.New(), opt).Err()
		if !errors.Is(err, dlock.ErrInvalidOption) || !strings.HasPrefix(err.Error(), "dlockotel: ") {
			t.Errorf("%s: got %v, want a dlockotel: error matching ErrInvalidOption", name, err)
		}
	}
	o, err := dlockotel.NewObserver(nil, nil)
	if err != nil || o.Enabled() {
		t.Fatalf("NewObserver(nil, nil): got enabled=%v, %v; want disabled, nil", o.Enabled(), err)
	}
}

// acquireReleaseAllocs returns the allocations of one Acquire+Release on
// a Client with opts, with another lease held meanwhile so the watchdog
// goroutine runs throughout and does not add its start-up to the count.
func acquireReleaseAllocs(t *testing.T, opts ...dlock.Option) float64 {
	t.Helper()
	c := dlock.New(memlock.New(), opts...)
	if err := c.Err(); err != nil {
		t.Fatalf("dlock.New: %v", err)
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Acquire(ctx, "held"); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return testing.AllocsPerRun(200, func() {
		l, err := c.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

func TestNoopProvidersCostNothing(t *testing.T) {
	o, err := dlockotel.NewObserver(metricnoop.NewMeterProvider(), tracenoop.NewTracerProvider())
	if err != nil || o.Enabled() {
		t.Fatalf("NewObserver(noop, noop): got enabled=%v, %v; want disabled, nil", o.Enabled(), err)
	}
	base := acquireReleaseAllocs(t)
	noop := acquireReleaseAllocs(t,
		dlockotel.WithMeterProvider(metricnoop.NewMeterProvider()),
		dlockotel.WithTracerProvider(tracenoop.NewTracerProvider()),
		o.Option())
	if noop != base {
		t.Fatalf("allocs per Acquire+Release with no-op providers: got %v, want %v (as without)", noop, base)
	}
}

// With a real MeterProvider (no tracing), recording allocates nothing: the
// only extra allocations are none at all.
func TestMetricsAllocateNothing(t *testing.T) {
	tm := newTelemetry(t)
	base := acquireReleaseAllocs(t)
	got := acquireReleaseAllocs(t, dlockotel.WithMeterProvider(tm.mp, dlockotel.WithBackendName("memlock")))
	if got != base {
		t.Fatalf("allocs per Acquire+Release with SDK metrics: got %v, want %v (as without)", got, base)
	}
	if n := tm.sum(t, dlockotel.MetricAcquisitions, dlockotel.AttrBackend.String("memlock"), outcome("acquired")); n < 200 {
		t.Fatalf("acquisitions: got %d, want at least 200", n)
	}
}

// Release with a nil context is rejected by the core, which still reports
// it: the observer must not panic on it.
func TestReleaseNilContext(t *testing.T) {
	tm := newTelemetry(t)
	c := dlock.New(memlock.New(), dlockotel.WithMeterProvider(tm.mp), dlockotel.WithTracerProvider(tm.tp))
	t.Cleanup(func() { c.Close() })
	key := uniqueKey(t)
	l, err := c.Acquire(ctxT(t, 10*time.Second), key)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	//lint:ignore SA1012 tests Release's nil-context guard
	if err := l.Release(nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("Release(nil): got %v, want ErrInvalidOption", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 1)
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0)
	// Rejected after the release: still counted once.
	//lint:ignore SA1012 tests Release's nil-context guard
	if err := l.Release(nil); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("Release(nil) after Release: got %v, want ErrInvalidOption", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0)
	wantCount(t, tm, dlockotel.MetricHoldDuration, 1, outcome("released"))
	if n := len(tm.ended(dlockotel.SpanRelease, key)); n != 1 {
		t.Fatalf("release spans: got %d, want 1 (calls rejected for their nil ctx make none)", n)
	}
}
