package dlockotel_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/redis/go-redis/v9"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
)

// discard is a span processor that drops ended spans: the SDK still
// records every span, nothing accumulates.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }

// warmup is the number of untimed Acquire+Release before each variant.
const warmup = 200

// BenchmarkAcquireRelease measures the hot path, Acquire then Release of
// a free lock, on memlock and on a real redis-server, for
//
//	none:    a Client without any observer,
//	noop:    dlockotel with the no-op providers (it installs nothing),
//	metrics: dlockotel with an SDK MeterProvider (ManualReader),
//	sdk:     dlockotel with SDK meter and tracer providers (every span
//	         sampled and recorded, then dropped).
//
// Besides wall time it reports cpu-ns/op, the process's CPU time (user +
// system, all goroutines) per operation, which waiting for a CPU on a
// loaded machine does not inflate. Compare none and noop with benchstat
// over -count 6 or more; -count repeats each variant back to back, so on a
// machine whose load varies, run the test binary several times with
// -test.count 1 instead to interleave the variants.
func BenchmarkAcquireRelease(b *testing.B) {
	backends := []struct {
		name string
		new  func(b *testing.B) dlock.Backend
	}{
		{"memlock", func(*testing.B) dlock.Backend { return memlock.New() }},
		{"redis", func(b *testing.B) dlock.Backend {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			b.Cleanup(func() { rdb.Close() })
			return redislock.New(rdb)
		}},
	}
	variants := []struct {
		name string
		opts func(b *testing.B) []dlock.Option
	}{
		{"none", func(*testing.B) []dlock.Option { return nil }},
		{"noop", func(*testing.B) []dlock.Option {
			return []dlock.Option{
				dlockotel.WithMeterProvider(metricnoop.NewMeterProvider()),
				dlockotel.WithTracerProvider(tracenoop.NewTracerProvider()),
			}
		}},
		{"metrics", func(b *testing.B) []dlock.Option {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			b.Cleanup(func() { mp.Shutdown(context.Background()) })
			return []dlock.Option{dlockotel.WithMeterProvider(mp, dlockotel.WithBackendName("bench"))}
		}},
		{"sdk", func(b *testing.B) []dlock.Option {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}))
			b.Cleanup(func() {
				mp.Shutdown(context.Background())
				tp.Shutdown(context.Background())
			})
			o, err := dlockotel.NewObserver(mp, tp, dlockotel.WithBackendName("bench"))
			if err != nil {
				b.Fatal(err)
			}
			return []dlock.Option{o.Option()}
		}},
	}
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			for _, v := range variants {
				b.Run(v.name, func(b *testing.B) {
					c := dlock.New(be.new(b), v.opts(b)...)
					if err := c.Err(); err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					ctx := context.Background()
					key := uniqueKey(b)
					run := func() {
						l, err := c.Acquire(ctx, key)
						if err != nil {
							b.Fatal(err)
						}
						if err := l.Release(ctx); err != nil {
							b.Fatal(err)
						}
					}
					// Warm up (connections, pools, the SDK's aggregators) and
					// collect the previous variant's garbage before timing,
					// so that the order of the variants does not matter.
					for range warmup {
						run()
					}
					runtime.GC()
					b.ReportAllocs()
					cpu0, cpuOK := cpuTime()
					for b.Loop() {
						run()
					}
					if cpu1, ok := cpuTime(); ok && cpuOK {
						b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
					}
				})
			}
		})
	}
}
