package dlockotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
)

// harness describes a backend the scenarios run on.
type harness struct {
	name       string        // the dlock.backend attribute
	ttl        time.Duration // lease TTL of the observed clients
	newBackend func(t *testing.T) dlock.Backend
	// lose deletes key's lock on the server behind its holder's back, so
	// that the next renewal finds it gone.
	lose func(t *testing.T, b dlock.Backend, key string)
}

func memHarness() harness {
	store := memlock.NewStore()
	return harness{
		name:       "memlock",
		ttl:        100 * time.Millisecond,
		newBackend: func(*testing.T) dlock.Backend { return store.Backend() },
		lose: func(t *testing.T, b dlock.Backend, key string) {
			t.Helper()
			if _, err := b.(*memlock.Backend).ForceRelease(context.Background(), key); err != nil {
				t.Fatalf("ForceRelease: %v", err)
			}
		},
	}
}

func redisHarness() harness {
	return harness{
		name: "redis",
		ttl:  400 * time.Millisecond,
		newBackend: func(t *testing.T) dlock.Backend {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			t.Cleanup(func() { rdb.Close() })
			return redislock.New(rdb)
		},
		lose: func(t *testing.T, b dlock.Backend, key string) {
			t.Helper()
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			defer rdb.Close()
			n, err := rdb.Del(context.Background(), b.(*redislock.Backend).LockName(key)).Result()
			if err != nil || n != 1 {
				t.Fatalf("DEL lock of %q: got %d, %v; want 1, nil", key, n, err)
			}
		},
	}
}

func TestMemlock(t *testing.T) { runScenarios(t, memHarness()) }
func TestRedislock(t *testing.T) {
	t.Parallel()
	runScenarios(t, redisHarness())
}

func runScenarios(t *testing.T, h harness) {
	t.Run("AcquireRelease", func(t *testing.T) { t.Parallel(); testAcquireRelease(t, h) })
	t.Run("Contention", func(t *testing.T) { t.Parallel(); testContention(t, h) })
	t.Run("BackendError", func(t *testing.T) { t.Parallel(); testBackendError(t, h) })
	t.Run("RenewLoseRelease", func(t *testing.T) { t.Parallel(); testRenewLoseRelease(t, h) })
	t.Run("Reentrant", func(t *testing.T) { t.Parallel(); testReentrant(t, h) })
	t.Run("ManyThenClose", func(t *testing.T) { t.Parallel(); testManyThenClose(t, h) })
}

// otelOptions returns the options that record into tm, naming the backend.
func otelOptions(h harness, tm *telemetry) []dlock.Option {
	return []dlock.Option{
		dlockotel.WithMeterProvider(tm.mp, dlockotel.WithBackendName(h.name)),
		dlockotel.WithTracerProvider(tm.tp, dlockotel.WithBackendName(h.name)),
	}
}

// newClient returns a Client on a new backend of h, recording into tm
// when tm is not nil, closed when the test ends.
func newClient(t *testing.T, h harness, tm *telemetry, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	all := []dlock.Option{dlock.WithTTL(h.ttl)}
	if tm != nil {
		all = append(all, otelOptions(h, tm)...)
	}
	return locktest.Closing(t, dlock.New(h.newBackend(t), append(all, opts...)...))
}

func outcome(s string) attribute.KeyValue { return dlockotel.AttrOutcome.String(s) }

// wantSum fails the test unless the counter name at attrs is want.
func wantSum(t *testing.T, tm *telemetry, name string, want int64, attrs ...attribute.KeyValue) {
	t.Helper()
	if got := tm.sum(t, name, attrs...); got != want {
		t.Fatalf("%s{%s}: got %d, want %d (points: %s)", name, fmtAttrs(attrs), got, want, tm.points(t, name))
	}
}

// wantCount fails the test unless the histogram name at attrs has want
// measurements, all positive.
func wantCount(t *testing.T, tm *telemetry, name string, want uint64, attrs ...attribute.KeyValue) {
	t.Helper()
	n, sum := tm.hist(t, name, attrs...)
	if n != want {
		t.Fatalf("%s{%s} count: got %d, want %d (points: %s)", name, fmtAttrs(attrs), n, want, tm.points(t, name))
	}
	if n > 0 && sum <= 0 {
		t.Fatalf("%s{%s} sum: got %v, want > 0", name, fmtAttrs(attrs), sum)
	}
}

// wantAttrs fails the test unless span has every attribute of want.
func wantAttrs(t *testing.T, span sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	for _, kv := range want {
		if got := attr(span.Attributes(), kv.Key); got != kv.Value {
			t.Fatalf("span %s attribute %s: got %v, want %v", span.Name(), kv.Key, got.Emit(), kv.Value.Emit())
		}
	}
}

func onlySpan(t *testing.T, tm *telemetry, name, key string) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := tm.ended(name, key)
	if len(spans) != 1 {
		t.Fatalf("%s spans of %q: got %d, want 1", name, key, len(spans))
	}
	return spans[0]
}

func testAcquireRelease(t *testing.T, h harness) {
	tm := newTelemetry(t)
	c := newClient(t, h, tm)
	key := uniqueKey(t)
	be := dlockotel.AttrBackend.String(h.name)
	ctx, parent := tm.tp.Tracer("test").Start(ctxT(t, 10*time.Second), "parent")

	l := locktest.MustAcquire(t, ctx, c, key)
	wantSum(t, tm, dlockotel.MetricAcquisitions, 1, be, outcome("acquired"))
	wantCount(t, tm, dlockotel.MetricAcquireDuration, 1, be, outcome("acquired"))
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 1, be)
	wantCount(t, tm, dlockotel.MetricHoldDuration, 0, be, outcome("released"))

	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0, be)
	wantCount(t, tm, dlockotel.MetricHoldDuration, 1, be, outcome("released"))

	// A repeated Release is traced but ends nothing: nothing is counted.
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("second Release: got %v, want ErrReleased", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0, be)
	wantCount(t, tm, dlockotel.MetricHoldDuration, 1, be, outcome("released"))
	wantSum(t, tm, dlockotel.MetricLeasesLost, 0, be)
	wantSum(t, tm, dlockotel.MetricWaiters, 0, be)
	parent.End()

	acq := onlySpan(t, tm, dlockotel.SpanAcquire, key)
	if got, want := acq.Parent().SpanID(), parent.SpanContext().SpanID(); got != want {
		t.Fatalf("acquire span parent: got %v, want the caller's span %v", got, want)
	}
	wantAttrs(t, acq, be, outcome("acquired"), dlockotel.AttrFence.Int64(int64(l.Fence())), dlockotel.AttrCount.Int(1))
	if acq.Status().Code != codes.Unset {
		t.Fatalf("acquire span status: got %v, want Unset", acq.Status())
	}
	// A backend that waits in a server-side queue brackets even a free
	// lock's grant with wait events: only the attempts are compared.
	var ev []sdktrace.Event
	for _, e := range acq.Events() {
		if e.Name == dlockotel.SpanEventAttempt {
			ev = append(ev, e)
		}
	}
	if len(ev) != 1 {
		t.Fatalf("acquire span events: got %v, want one %s", eventNames(acq.Events()), dlockotel.SpanEventAttempt)
	}
	if a, g := attr(ev[0].Attributes, dlockotel.AttrAttempt), attr(ev[0].Attributes, dlockotel.AttrGranted); a.AsInt64() != 1 || !g.AsBool() {
		t.Fatalf("attempt event: got attempt=%v granted=%v, want 1 true", a.Emit(), g.Emit())
	}

	rel := tm.ended(dlockotel.SpanRelease, key)
	if len(rel) != 2 {
		t.Fatalf("release spans: got %d, want 2", len(rel))
	}
	if got, want := rel[0].Parent().SpanID(), parent.SpanContext().SpanID(); got != want {
		t.Fatalf("release span parent: got %v, want the caller's span %v", got, want)
	}
	if links := rel[0].Links(); len(links) != 1 || !links[0].SpanContext.Equal(acq.SpanContext()) {
		t.Fatalf("release span links: got %v, want the acquire span %v", links, acq.SpanContext())
	}
	wantAttrs(t, rel[0], be, dlockotel.AttrFence.Int64(int64(l.Fence())))
	if held := attr(rel[0].Attributes(), dlockotel.AttrHeld).AsFloat64(); held <= 0 {
		t.Fatalf("release span %s: got %v, want > 0", dlockotel.AttrHeld, held)
	}
	if rel[0].Status().Code != codes.Unset {
		t.Fatalf("release span status: got %v, want Unset", rel[0].Status())
	}
	if rel[1].Status().Code != codes.Error || len(rel[1].Links()) != 0 {
		t.Fatalf("second release span: got status %v, %d links; want Error, 0 links", rel[1].Status(), len(rel[1].Links()))
	}
}

func testContention(t *testing.T, h harness) {
	tm := newTelemetry(t)
	c := newClient(t, h, tm)
	holder := newClient(t, h, nil)
	key := uniqueKey(t)
	be := dlockotel.AttrBackend.String(h.name)
	ctx := ctxT(t, 10*time.Second)

	hl := locktest.MustAcquire(t, ctx, holder, key)
	if _, err := c.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock: got %v, want ErrNotAcquired", err)
	}
	wantSum(t, tm, dlockotel.MetricAcquisitions, 1, be, outcome("not_acquired"))
	wantCount(t, tm, dlockotel.MetricAcquireDuration, 1, be, outcome("not_acquired"))

	done := locktest.Go(func() (*dlock.Lease, error) { return c.Acquire(ctx, key) })
	eventually(t, "one waiter", func() bool { return tm.sum(t, dlockotel.MetricWaiters, be) == 1 })
	if err := hl.Release(ctx); err != nil {
		t.Fatalf("holder Release: %v", err)
	}
	r := <-done
	if r.Err != nil {
		t.Fatalf("waiting Acquire: %v", r.Err)
	}
	wantSum(t, tm, dlockotel.MetricWaiters, 0, be)
	wantSum(t, tm, dlockotel.MetricAcquisitions, 1, be, outcome("acquired"))
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 1, be)

	// A wait ended by the context is not_acquired too.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(short, key); !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire until the deadline: got %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	wantSum(t, tm, dlockotel.MetricAcquisitions, 2, be, outcome("not_acquired"))
	wantCount(t, tm, dlockotel.MetricAcquireDuration, 2, be, outcome("not_acquired"))
	wantSum(t, tm, dlockotel.MetricWaiters, 0, be)
	wantSum(t, tm, dlockotel.MetricAcquisitions, 0, be, outcome("error"))

	spans := tm.ended(dlockotel.SpanAcquire, key)
	if len(spans) != 3 {
		t.Fatalf("acquire spans: got %d, want 3", len(spans))
	}
	try, waited, timedOut := spans[0], spans[1], spans[2]
	wantAttrs(t, try, outcome("not_acquired"))
	if try.Status().Code != codes.Error {
		t.Fatalf("TryAcquire span status: got %v, want Error", try.Status())
	}
	if ev := try.Events(); len(ev) != 1 || attr(ev[0].Attributes, dlockotel.AttrGranted).AsBool() ||
		attr(ev[0].Attributes, dlockotel.AttrHolderTTL).AsFloat64() <= 0 {
		t.Fatalf("TryAcquire span events: got %v, want one attempt, not granted, with the holder's TTL", events(ev))
	}

	wantAttrs(t, waited, outcome("acquired"), dlockotel.AttrFence.Int64(int64(r.Lease.Fence())))
	names := strings.Join(eventNames(waited.Events()), ",")
	if !strings.Contains(names, dlockotel.SpanEventWaitStart) || !strings.HasSuffix(names, dlockotel.SpanEventAttempt+","+dlockotel.SpanEventWaitEnd) {
		t.Fatalf("waiting Acquire span events: got %s, want attempts, %s, …, a last attempt, %s", names, dlockotel.SpanEventWaitStart, dlockotel.SpanEventWaitEnd)
	}
	var attempts []int64
	var lastGranted bool
	for _, e := range waited.Events() {
		if e.Name == dlockotel.SpanEventAttempt {
			attempts = append(attempts, attr(e.Attributes, dlockotel.AttrAttempt).AsInt64())
			lastGranted = attr(e.Attributes, dlockotel.AttrGranted).AsBool()
		}
	}
	for i, a := range attempts {
		if a != int64(i+1) {
			t.Fatalf("attempt numbers: got %v, want 1, 2, …", attempts)
		}
	}
	// The retry loop attempts at least twice; a server-side queue wait is
	// one attempt.
	if len(attempts) < 1 || !lastGranted {
		t.Fatalf("waiting Acquire: got %d attempts, last granted %v; want the last granted", len(attempts), lastGranted)
	}
	wantAttrs(t, timedOut, outcome("not_acquired"))
	if timedOut.Status().Code != codes.Error || !strings.Contains(timedOut.Status().Description, "deadline") {
		t.Fatalf("timed-out Acquire span status: got %v, want Error mentioning the deadline", timedOut.Status())
	}
}

func testBackendError(t *testing.T, h harness) {
	tm := newTelemetry(t)
	c := newClient(t, h, tm)
	key := uniqueKey(t)
	be := dlockotel.AttrBackend.String(h.name)
	if err := c.Backend().Close(); err != nil {
		t.Fatalf("Backend.Close: %v", err)
	}
	_, err := c.TryAcquire(ctxT(t, 10*time.Second), key)
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a closed backend: got %v, want a backend error", err)
	}
	wantSum(t, tm, dlockotel.MetricAcquisitions, 1, be, outcome("error"))
	wantCount(t, tm, dlockotel.MetricAcquireDuration, 1, be, outcome("error"))
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0, be)

	s := onlySpan(t, tm, dlockotel.SpanAcquire, key)
	wantAttrs(t, s, outcome("error"))
	if s.Status().Code != codes.Error || s.Status().Description != err.Error() {
		t.Fatalf("acquire span status: got %v, want Error %q", s.Status(), err)
	}
	names := eventNames(s.Events())
	if len(names) != 2 || names[0] != dlockotel.SpanEventAttempt || names[1] != "exception" {
		t.Fatalf("acquire span events: got %v, want [%s exception]", names, dlockotel.SpanEventAttempt)
	}
	if msg := attr(s.Events()[0].Attributes, dlockotel.AttrError).AsString(); msg == "" {
		t.Fatalf("failed attempt event: got no %s attribute, want the error", dlockotel.AttrError)
	}
}

func testRenewLoseRelease(t *testing.T, h harness) {
	tm := newTelemetry(t)
	c := newClient(t, h, tm)
	key := uniqueKey(t)
	be := dlockotel.AttrBackend.String(h.name)
	ctx := ctxT(t, 10*time.Second)

	l := locktest.MustAcquire(t, ctx, c, key)
	eventually(t, "two renewals", func() bool { return tm.sum(t, dlockotel.MetricRenewals, be) >= 2 })

	h.lose(t, c.Backend(), key)
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("lease not lost after its lock was deleted")
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Lease.Err: got %v, want ErrLost", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesLost, 1, be)
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0, be)
	if n := tm.sum(t, dlockotel.MetricRenewalFailures, be); n < 1 {
		t.Fatalf("%s: got %d, want at least 1 (the renewal that found the lock gone)", dlockotel.MetricRenewalFailures, n)
	}
	wantCount(t, tm, dlockotel.MetricHoldDuration, 1, be, outcome("lost"))

	// Releasing the lost lease reports the loss and counts nothing again.
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Release of a lost lease: got %v, want ErrLost", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0, be)
	wantSum(t, tm, dlockotel.MetricLeasesLost, 1, be)
	wantCount(t, tm, dlockotel.MetricHoldDuration, 0, be, outcome("released"))
	wantCount(t, tm, dlockotel.MetricHoldDuration, 1, be, outcome("lost"))
	if m, ok := tm.metric(t, dlockotel.MetricNodeErrors); ok {
		t.Fatalf("%s: got %v, want no points (no node errors)", dlockotel.MetricNodeErrors, m.Data)
	}

	acq := onlySpan(t, tm, dlockotel.SpanAcquire, key)
	lost := onlySpan(t, tm, dlockotel.SpanLost, key)
	if lost.Parent().IsValid() {
		t.Fatalf("lost span parent: got %v, want none (a root span)", lost.Parent())
	}
	if links := lost.Links(); len(links) != 1 || !links[0].SpanContext.Equal(acq.SpanContext()) {
		t.Fatalf("lost span links: got %v, want the acquire span %v", links, acq.SpanContext())
	}
	wantAttrs(t, lost, be, dlockotel.AttrFence.Int64(int64(l.Fence())))
	if lost.Status().Code != codes.Error || !strings.Contains(lost.Status().Description, "lost") {
		t.Fatalf("lost span status: got %v, want Error about the loss", lost.Status())
	}
	if held := attr(lost.Attributes(), dlockotel.AttrHeld).AsFloat64(); held < (2 * h.ttl / 3).Seconds() {
		t.Fatalf("lost span %s: got %vs, want at least two renewal periods (%v)", dlockotel.AttrHeld, held, 2*h.ttl/3)
	}
	rel := onlySpan(t, tm, dlockotel.SpanRelease, key)
	if rel.Status().Code != codes.Error {
		t.Fatalf("release span of a lost lease: got status %v, want Error", rel.Status())
	}
}

func testReentrant(t *testing.T, h harness) {
	tm := newTelemetry(t)
	c := newClient(t, h, tm, dlock.WithOwner("job-"+uniqueKey(t)))
	key := uniqueKey(t)
	be := dlockotel.AttrBackend.String(h.name)
	ctx := ctxT(t, 10*time.Second)

	outer := locktest.MustAcquire(t, ctx, c, key)
	inner := locktest.MustAcquire(t, ctx, c, key)
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 2, be)
	wantSum(t, tm, dlockotel.MetricAcquisitions, 2, be, outcome("acquired"))
	for _, l := range []*dlock.Lease{inner, outer} {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0, be)
	wantCount(t, tm, dlockotel.MetricHoldDuration, 2, be, outcome("released"))

	spans := tm.ended(dlockotel.SpanAcquire, key)
	if len(spans) != 2 {
		t.Fatalf("acquire spans: got %d, want 2", len(spans))
	}
	fence := dlockotel.AttrFence.Int64(int64(outer.Fence()))
	wantAttrs(t, spans[0], fence, dlockotel.AttrCount.Int(1))
	wantAttrs(t, spans[1], fence, dlockotel.AttrCount.Int(2))
}

// testManyThenClose: leases taken by AcquireMany count as held and as
// acquisitions; Client.Close ends them as releases (a span each), and the
// held gauge returns to zero.
func testManyThenClose(t *testing.T, h harness) {
	tm := newTelemetry(t)
	be := dlockotel.AttrBackend.String(h.name)
	c := dlock.New(h.newBackend(t), append([]dlock.Option{dlock.WithTTL(h.ttl)}, otelOptions(h, tm)...)...)
	tag := "{" + locktest.Key(t) + "}"
	keys := []string{tag + "a", tag + "b"}
	if _, err := c.AcquireMany(locktest.Ctx(t, 10*time.Second), keys); err != nil {
		t.Fatalf("AcquireMany: %v", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 2, be)
	wantSum(t, tm, dlockotel.MetricAcquisitions, 2, be, outcome(dlockotel.OutcomeAcquired))
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wantSum(t, tm, dlockotel.MetricLeasesHeld, 0, be)
	for _, k := range keys {
		onlySpan(t, tm, dlockotel.SpanAcquire, k)
		onlySpan(t, tm, dlockotel.SpanRelease, k)
	}
}

func fmtAttrs(attrs []attribute.KeyValue) string {
	set := attribute.NewSet(attrs...)
	return set.Encoded(attribute.DefaultEncoder())
}

func eventNames(ev []sdktrace.Event) []string {
	out := make([]string, len(ev))
	for i, e := range ev {
		out[i] = e.Name
	}
	return out
}

func events(ev []sdktrace.Event) string {
	var b strings.Builder
	for _, e := range ev {
		b.WriteString(e.Name)
		set := attribute.NewSet(e.Attributes...)
		b.WriteString(set.Encoded(attribute.DefaultEncoder()))
		b.WriteString("; ")
	}
	return b.String()
}

// spanOf returns the span the backend received in its context.
func spanOf(ctx context.Context) trace.SpanContext { return trace.SpanContextFromContext(ctx) }
