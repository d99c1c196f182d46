package main

import (
	"fmt"
	"github.com/spf13/cobra"
	"time"

	"github.com/dlock-go/dlock"
)

// waitValue is the --wait flag: a duration ≥ 0, or "forever".
type waitValue struct {
	d       time.Duration
	forever bool
}

func (w *waitValue) String() string {
	if w.forever {
		return "forever"
	}
	return w.d.String()
}

func (w *waitValue) Set(s string) error {
	if s == "forever" {
		*w = waitValue{forever: true}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 30s or 5m, or forever")
	}
	if d < 0 {
		return fmt.Errorf("must not be negative")
	}
	*w = waitValue{d: d}
	return nil
}

func (w *waitValue) Type() string { return "duration" }

// clientOptions returns the options every dlock.Client the CLI creates
// gets, before the command's own. It is the one place where observability
// attaches to the CLI: the --metrics-addr flag (an OpenTelemetry
// Prometheus exporter) registers on the commands that hold locks (run,
// demo) and adds its meter provider here.
func (g *globals) clientOptions(opts ...dlock.Option) []dlock.Option {
	base := []dlock.Option{dlock.WithReleaseTimeout(g.timeout)}
	if g.metrics != nil {
		base = append(base, g.metrics.opt)
	}
	return append(base, opts...)
}

// addMetricsFlag registers --metrics-addr on cmd and starts the endpoint
// before cmd runs.
func (g *globals) addMetricsFlag(cmd *cobra.Command) {
	cmd.Flags().StringVar(&g.metricsAddr, "metrics-addr", "", "serve lock metrics (OpenTelemetry, Prometheus text format) on this address at /metrics, e.g. 127.0.0.1:9464; default off")
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error { return g.startMetrics(cmd.ErrOrStderr()) }
}
