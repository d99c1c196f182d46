package dlockotel_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// srv is the redis-server shared by the redislock tests and benchmarks.
var srv *testserver.Redis

// testMain stops the server after the tests and before goleak looks for
// leaked goroutines (testserver keeps one while servers run).
type testMain struct{ m *testing.M }

func (tm testMain) Run() int {
	code := tm.m.Run()
	if err := srv.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "dlockotel tests: stop redis-server:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func TestMain(m *testing.M) {
	var err error
	srv, err = testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dlockotel tests:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(testMain{m})
}

// telemetry is an in-memory OpenTelemetry pipeline: a ManualReader for
// metrics and a SpanRecorder for spans.
type telemetry struct {
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	mp     *sdkmetric.MeterProvider
	tp     *sdktrace.TracerProvider
}

func newTelemetry(t testing.TB) *telemetry {
	t.Helper()
	tm := &telemetry{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	tm.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tm.reader))
	tm.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tm.spans))
	t.Cleanup(func() {
		ctx := context.Background()
		if err := tm.mp.Shutdown(ctx); err != nil {
			t.Errorf("MeterProvider.Shutdown: %v", err)
		}
		if err := tm.tp.Shutdown(ctx); err != nil {
			t.Errorf("TracerProvider.Shutdown: %v", err)
		}
	})
	return tm
}

func (tm *telemetry) collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tm.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return rm
}

func (tm *telemetry) metric(t testing.TB, name string) (metricdata.Metrics, bool) {
	t.Helper()
	for _, sm := range tm.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// sum returns the value of the counter or up-down counter name at the
// point with exactly attrs (0 when there is none).
func (tm *telemetry) sum(t testing.TB, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := tm.metric(t, name)
	if !ok {
		return 0
	}
	data, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s: got data %T, want metricdata.Sum[int64]", name, m.Data)
	}
	set := attribute.NewSet(attrs...)
	for _, dp := range data.DataPoints {
		if dp.Attributes.Equals(&set) {
			return dp.Value
		}
	}
	return 0
}

// hist returns the count and sum of the histogram name at the point with
// exactly attrs (zeros when there is none).
func (tm *telemetry) hist(t testing.TB, name string, attrs ...attribute.KeyValue) (uint64, float64) {
	t.Helper()
	m, ok := tm.metric(t, name)
	if !ok {
		return 0, 0
	}
	data, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s: got data %T, want metricdata.Histogram[float64]", name, m.Data)
	}
	set := attribute.NewSet(attrs...)
	for _, dp := range data.DataPoints {
		if dp.Attributes.Equals(&set) {
			return dp.Count, dp.Sum
		}
	}
	return 0, 0
}

// points returns every attribute set recorded for name, for messages.
func (tm *telemetry) points(t testing.TB, name string) string {
	t.Helper()
	m, ok := tm.metric(t, name)
	if !ok {
		return "(no points)"
	}
	var out []string
	switch data := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range data.DataPoints {
			out = append(out, fmt.Sprintf("{%s}=%d", dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
		}
	case metricdata.Histogram[float64]:
		for _, dp := range data.DataPoints {
			out = append(out, fmt.Sprintf("{%s} count=%d", dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Count))
		}
	}
	return strings.Join(out, " ")
}

// ended returns the ended spans named name whose dlock.key is key.
func (tm *telemetry) ended(name, key string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tm.spans.Ended() {
		if s.Name() == name && attr(s.Attributes(), "dlock.key").AsString() == key {
			out = append(out, s)
		}
	}
	return out
}

// attr returns the value of key in kvs (an invalid value when absent).
func attr(kvs []attribute.KeyValue, key attribute.Key) attribute.Value {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

var (
	uniqueKey = locktest.Key
	ctxT      = locktest.Ctx
)

// eventually waits up to 10s for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	locktest.WaitFor(t, 10*time.Second, what, cond)
}
