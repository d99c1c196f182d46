package verify_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/dlock-go/dlock/verify"
)

// A program wires the harness in two places: its worker entry point (a
// subcommand, or the WorkerEnv check) and the coordinator. openURL is the
// program's URL factory (here the tests' one).
func Example() {
	openURL := open
	ctx := context.Background()

	// 1. The worker: `prog verify-worker ARGS...` must end up here, with
	// nothing else written to standard output.
	if len(os.Args) > 1 && os.Args[1] == "verify-worker" {
		os.Exit(verify.WorkerMain(ctx, os.Args[2:], openURL))
	}

	// 2. The coordinator: `prog verify --backend redis://local --faults pause,kill ...`.
	exe, _ := os.Executable()
	cfg := verify.DefaultConfig()
	cfg.BackendURL = "redis://local" // the harness starts redis-server itself
	cfg.Name = "redislock"
	cfg.Faults = []string{verify.FaultPause, verify.FaultKill}
	cfg.Duration = 60 * time.Second
	cfg.Runs = 10
	cfg.OutDir = "verify-out"
	cfg.Exe = []string{exe, "verify-worker"}
	rep, err := verify.Run(ctx, cfg, openURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Print(rep.Table())
	if !rep.OK() {
		os.Exit(1)
	}
}
