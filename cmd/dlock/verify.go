package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/verify"
)

// openURL is the verify harness's backend factory: the CLI's own URL
// parsing and connection code, used by the coordinator and by every
// worker process. The harness's lease TTL is the longest lease taken, so
// ZooKeeper sessions are opened with it: a longer session would keep a
// paused or killed holder's lock past the TTL the faults are scaled to.
func openURL(timeout time.Duration) verify.OpenFunc {
	return func(ctx context.Context, url string, ttl time.Duration) (dlock.Backend, func() error, error) {
		spec, err := parseBackendURL(url)
		if err != nil {
			return nil, nil, err
		}
		c, err := openBackend(ctx, spec, timeout, ttl)
		if err != nil {
			return nil, nil, err
		}
		return c.backend, c.Close, nil
	}
}

func newVerifyCmd(g *globals) *cobra.Command {
	cfg := verify.DefaultConfig()
	var faults string
	cmd := &cobra.Command{
		Use:   "verify [flags]",
		Short: "Measure a backend's safety under faults (Jepsen-style)",
		Long: `verify runs worker processes that take the lock and read-modify-write a fenced and a
naive register in a separate redis-server, injects faults, and checks the histories: lease
overlap on the server, fence order, stale writes accepted by the fenced register (must be 0),
lost updates, linearizability (porcupine; HTML timelines in --out) and liveness.

--backend with the host "local" (redis://local, redlock://local, etcd://local, zk://local)
starts throwaway servers; the restart, server-pause and proxy faults need that.

--fifo makes every worker acquire with dlock.WithFIFO(): redislock then queues waiters on the
server and a release hands the lock to the next one; etcd and ZooKeeper always queue; redlock has
no queue and is refused. The report marks such rows "(FIFO)".

Faults: ` + strings.Join(verify.FaultNames(), ", ") + ` ("a+b" mixes two in one run).
Exit status: 0 when every run passed, 1 when a run failed or was invalid, 2 on bad input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.BackendURL = g.backend
			if !cmd.Flags().Changed("backend") && os.Getenv("DLOCK_BACKEND") == "" {
				cfg.BackendURL = "redis://local"
			}
			cfg.Faults = nil
			for _, f := range strings.Split(faults, ",") {
				if f = strings.TrimSpace(f); f != "" {
					cfg.Faults = append(cfg.Faults, f)
				}
			}
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("verify: %w", err)
			}
			cfg.Exe = []string{exe, "verify-worker", "--timeout", g.timeout.String()}
			stderr := cmd.ErrOrStderr()
			cfg.Progress = func(msg string) { fmt.Fprintln(stderr, msg) }
			rep, err := verify.Run(cmd.Context(), cfg, openURL(g.timeout))
			if err != nil {
				return exitWith(exitUsage, err)
			}
			fmt.Fprint(cmd.OutOrStdout(), rep.Table())
			if !rep.OK() {
				return exitWith(exitFailure, fmt.Errorf("verify: a run failed or was invalid; see %s", cfg.OutDir))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&faults, "faults", "pause", "faults to inject, comma-separated")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of each run")
	f.IntVar(&cfg.Workers, "workers", cfg.Workers, "worker processes (at least 2)")
	f.IntVar(&cfg.Runs, "runs", cfg.Runs, "runs per fault")
	f.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the fault schedule (replayable)")
	f.StringVar(&cfg.OutDir, "out", cfg.OutDir, "directory for histories, HTML timelines and report.md")
	f.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "lease TTL of the workers")
	f.StringVar(&cfg.Name, "name", cfg.Name, "backend name in the report")
	f.StringVar(&cfg.ResourceMode, "resource", cfg.ResourceMode, "register to check: fenced, naive or both")
	f.BoolVar(&cfg.FIFO, "fifo", cfg.FIFO, "workers acquire in FIFO mode (dlock.WithFIFO: server-side queue, hand-off on release); redlock refuses it")
	return cmd
}

// newVerifyWorkerCmd is the hidden entry point of verify's worker
// processes; it writes nothing to stdout but the worker protocol.
func newVerifyWorkerCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "verify-worker",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			timeout := 5 * time.Second
			if len(args) >= 2 && args[0] == "--timeout" {
				if d, err := time.ParseDuration(args[1]); err == nil {
					timeout = d
				}
				args = args[2:]
			}
			if code := verify.WorkerMain(cmd.Context(), args, openURL(timeout)); code != 0 {
				return exitWith(code, fmt.Errorf("verify worker exited with %d", code))
			}
			return nil
		},
	}
}
