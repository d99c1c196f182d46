package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/verify"
)

// openURL is the verify harness's backend factory: the CLI's own URL
// parsing and connection code, used by the coordinator and by every
// worker process. The harness's lease TTL is the longest lease taken, so
// ZooKeeper sessions are opened with it: a longer session would keep a
// paused or killed holder's lock past the TTL the faults are scaled to.
func openURL(timeout time.Duration) verify.OpenFunc {
	return verify.WithWeakening(func(ctx context.Context, url string, ttl time.Duration) (dlock.Backend, func() error, error) {
		url, replicas, err := cutReplicas(url)
		if err != nil {
			return nil, nil, err
		}
		spec, err := parseBackendURL(url)
		if err != nil {
			return nil, nil, err
		}
		if replicas > 0 {
			return openReplicated(ctx, spec, timeout, ttl, replicas)
		}
		c, err := openBackend(ctx, spec, timeout, ttl)
		if err != nil {
			return nil, nil, err
		}
		return c.backend, c.Close, nil
	})
}

// replicasParam is the query parameter of a Redis backend URL given to
// verify ("redis+sentinel://local?replicas=2") that makes the workers
// acquire with redislock.WithReplicas(N, …).
const replicasParam = "replicas"

// cutReplicas removes the replicas parameter from url and returns its
// value, 0 when absent.
func cutReplicas(url string) (string, int, error) {
	base, query, ok := strings.Cut(url, "?")
	if !ok {
		return url, 0, nil
	}
	n := 0
	var keep []string
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k != replicasParam {
			keep = append(keep, kv)
			continue
		}
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			return "", 0, usageErrorf("invalid backend URL %q: %s=%s is not a replica count ≥ 1", verify.RedactURL(url), replicasParam, v)
		}
	}
	if len(keep) > 0 {
		base += "?" + strings.Join(keep, "&")
	}
	return base, n, nil
}

// openReplicated opens a redislock backend whose acquisitions wait for n
// replicas (redislock.WithReplicas), with a WAIT timeout of a quarter of
// the TTL (at most half the client timeout, below its read timeout).
func openReplicated(ctx context.Context, spec *backendSpec, timeout, ttl time.Duration, n int) (dlock.Backend, func() error, error) {
	if !strings.HasPrefix(spec.scheme, "redis") {
		return nil, nil, usageErrorf("invalid backend URL %q: %s= needs a Redis backend", spec.redacted(), replicasParam)
	}
	rdb, err := newRedisClient(spec, timeout)
	if err != nil {
		return nil, nil, err
	}
	if err := pingRedis(ctx, rdb, timeout); err != nil {
		_ = rdb.Close()
		return nil, nil, exitWith(exitFailure, unavailable(spec.scheme, strings.Join(spec.hosts, ","), timeout, err))
	}
	b := redislock.New(rdb, redislock.WithReplicas(n, min(ttl/4, timeout/2)))
	if err := b.Err(); err != nil {
		_ = rdb.Close()
		return nil, nil, usageErrorf("invalid backend URL %q: %v", spec.redacted(), err)
	}
	return b, rdb.Close, nil
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

--backend with the host "local" (redis://local, redlock://local, etcd://local, zk://local,
postgres://local, postgres://local?mode=session) starts throwaway servers; the restart,
server-pause and proxy faults need that. Without --backend or $DLOCK_BACKEND, verify
runs on redis://local. SIGINT or SIGTERM stops the servers and workers it started and
exits 130.

Replicated deployments: redis+sentinel://local (a primary, two replicas, three sentinels;
"?n=2" for one replica), redis+cluster://local (3 primaries × 1 replica), etcd://local?n=3 and
zk://local?n=3 (a cluster and an ensemble of 3). The leader-kill and leader-pause faults hit the
current primary (of the lock's slot) or leader; leader-partition (Sentinel, etcd, zk; Linux,
root) cuts the primary or leader off from the other nodes and the workers, each data node or
member in its own network namespace, and heals it. "?replicas=N" on a Redis URL makes the
workers acquire with redislock.WithReplicas(N, TTL/4).

Positive controls: "?weaken=forget" runs the workers on a lock that releases every grant on the
server at once (the run must fail with lease overlaps), "?weaken=same-fence" also gives every
grant fence 1 (fence regressions), "?weaken=no-fence-check" also turns the fenced register's
check off (stale writes accepted), on any backend URL.

--fifo makes every worker acquire with dlock.WithFIFO(): it joins the server-side queue at once,
without a first plain attempt (redislock, etcd and ZooKeeper queue every wait anyway, and a
release hands the lock to the next waiter); redlock and postgres have no queue and are refused.
The report marks such rows "(FIFO)".

--kind selects what the workers take: lock (the default), permits:N (one permit of an N-permit
semaphore; at most N holds at once, in the histories and in the server's view), rw (a read-write
lock: one acquisition in 4 a write hold doing the read-modify-write, the others read holds that
touch no register; no read hold may overlap a write hold) or election (campaign, lead for the
read-modify-write, resign; no two leaderships may overlap). The report marks such rows "[KIND]".

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
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rep, err := verify.Run(ctx, cfg, openURL(g.timeout))
			if err != nil {
				if ctx.Err() != nil && cmd.Context().Err() == nil {
					// The servers and workers it started are stopped.
					return exitWith(130, fmt.Errorf("verify: interrupted: %w", err))
				}
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
	f.StringVar(&cfg.Kind, "kind", "lock", "what workers take: lock, permits:N (semaphore), rw (read-write lock) or election")
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
