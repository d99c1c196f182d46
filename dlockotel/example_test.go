package dlockotel_test

import (
	"context"
	"fmt"
	"sort"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/memlock"
)

// Record a Client's metrics with an OpenTelemetry MeterProvider; here an
// in-memory ManualReader stands in for an exporter (Prometheus, OTLP).
func Example() {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	c := dlock.New(memlock.New(), dlockotel.WithMeterProvider(mp, dlockotel.WithBackendName("memory")))
	defer c.Close()
	for range 2 {
		l, err := c.Acquire(ctx, "order:1001")
		if err != nil {
			fmt.Println(err)
			return
		}
		if _, err := c.TryAcquire(ctx, "order:1001"); err != nil {
			fmt.Println(err) // held by l: not acquired
		}
		l.Release(ctx)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		fmt.Println(err)
		return
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s{%s} %d", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s{%s} count=%d", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Count))
				}
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// dlock: lock "order:1001" not acquired after 1 attempt: held by another owner, wait strategy gave up
	// dlock: lock "order:1001" not acquired after 1 attempt: held by another owner, wait strategy gave up
	// dlock.acquire.duration{dlock.backend=memory,dlock.outcome=acquired} count=2
	// dlock.acquire.duration{dlock.backend=memory,dlock.outcome=not_acquired} count=2
	// dlock.acquisitions{dlock.backend=memory,dlock.outcome=acquired} 2
	// dlock.acquisitions{dlock.backend=memory,dlock.outcome=error} 0
	// dlock.acquisitions{dlock.backend=memory,dlock.outcome=not_acquired} 2
	// dlock.hold.duration{dlock.backend=memory,dlock.outcome=released} count=2
	// dlock.leases.held{dlock.backend=memory} 0
	// dlock.leases.lost{dlock.backend=memory} 0
	// dlock.renewal.failures{dlock.backend=memory} 0
	// dlock.renewals{dlock.backend=memory} 0
	// dlock.waiters{dlock.backend=memory} 0
}
