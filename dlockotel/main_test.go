package dlockotel_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/locktest/testmain"
	"github.com/dlock-go/dlock/internal/testserver"
)

// srv is the redis-server shared by the redislock tests and benchmarks.
var srv *testserver.Redis

func TestMain(m *testing.M) {
	var err error
	if srv, err = testserver.StartRedis(testserver.RedisOptions{}); err != nil {
		testmain.Fail("dlockotel", err)
	}
	testmain.Run(m, "dlockotel", srv.Stop)
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

// metricData returns the data of the metric name, false when it has no
// points; it fails the test when the data is not a T.
func metricData[T any](t testing.TB, tm *telemetry, name string) (T, bool) {
	t.Helper()
	var data T
	m, ok := tm.metric(t, name)
	if !ok {
		return data, false
	}
	if data, ok = m.Data.(T); !ok {
		t.Fatalf("%s: got data %T, want %T", name, m.Data, data)
	}
	return data, true
}

// sum returns the value of the counter or up-down counter name at the
// point with exactly attrs (0 when there is none).
func (tm *telemetry) sum(t testing.TB, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	data, ok := metricData[metricdata.Sum[int64]](t, tm, name)
	if !ok {
		return 0
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
	data, ok := metricData[metricdata.Histogram[float64]](t, tm, name)
	if !ok {
		return 0, 0
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
