package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlockotel"
)

// metrics serves the lock metrics of this process (package dlockotel) in
// the Prometheus text format on --metrics-addr, through the OpenTelemetry
// Prometheus exporter. Off when the flag is empty (the default).
type metrics struct {
	mp  *sdkmetric.MeterProvider
	srv *http.Server
	opt dlock.Option
}

// startMetrics starts the endpoint when g.metricsAddr is set and records
// the option every Client then gets.
func (g *globals) startMetrics(stderr io.Writer) error {
	if g.metricsAddr == "" || g.metrics != nil {
		return nil
	}
	ln, err := net.Listen("tcp", g.metricsAddr)
	if err != nil {
		return usageErrorf("--metrics-addr %q: %v", g.metricsAddr, err)
	}
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		ln.Close()
		return fmt.Errorf("metrics: %w", err)
	}
	m := &metrics{mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))}
	scheme := "unknown"
	if spec, err := parseBackendURL(g.backend); err == nil {
		scheme = spec.scheme
	}
	m.opt = dlockotel.WithMeterProvider(m.mp, dlockotel.WithBackendName(scheme))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = m.srv.Serve(ln) }()
	fmt.Fprintf(stderr, "dlock: metrics on http://%s/metrics\n", ln.Addr())
	g.metrics = m
	return nil
}

// stopMetrics shuts the endpoint down.
func (g *globals) stopMetrics() {
	if g.metrics == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := g.metrics.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = g.metrics.srv.Close()
	}
	_ = g.metrics.mp.Shutdown(ctx)
	g.metrics = nil
}
