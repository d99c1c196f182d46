// Command dlock takes distributed locks from the shell: run a command
// while holding a lock (a distributed flock(1), for cron jobs that must run
// on one host of a fleet at a time), one of N permits of a semaphore, a
// read hold of a read-write lock, or the leadership of an election; show
// and watch an election's leader; inspect and release locks; and run a
// demonstration of what locks and fencing tokens are for.
//
//	dlock run [flags] [--permits N | --shared] KEY -- COMMAND [ARGS...]
//	dlock leader run [flags] [--value V] KEY -- COMMAND [ARGS...]
//	dlock leader show KEY [--json]
//	dlock leader watch KEY [--json]
//	dlock inspect KEY [--json]
//	dlock release KEY --owner OWNER | --force
//	dlock demo [--json]
//
// The lock server is chosen by URL (--backend, or $DLOCK_BACKEND; default
// redis://127.0.0.1:6379). Run `dlock --help` for the details and the exit
// codes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock"
)

// quietLogger discards go-redis' internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func main() {
	// go-redis logs dial failures on its own; dlock reports errors itself.
	redis.SetLogger(quietLogger{})
	os.Exit(execute(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// globals are the flags every command shares.
type globals struct {
	backend     string        // --backend URL
	timeout     time.Duration // --timeout for connecting and each server operation
	metricsAddr string        // --metrics-addr (run, demo): serve Prometheus metrics
	metrics     *metrics      // the running metrics endpoint, if any
}

// spec parses the backend URL and validates --timeout.
func (g *globals) spec() (*backendSpec, error) {
	if g.timeout <= 0 {
		return nil, usageErrorf("invalid --timeout %v: must be positive", g.timeout)
	}
	return parseBackendURL(g.backend)
}

// open parses the backend URL and connects, checking within --timeout that
// the servers answer.
func (g *globals) open(ctx context.Context) (*conn, error) {
	spec, err := g.spec()
	if err != nil {
		return nil, err
	}
	return openBackend(ctx, spec, g.timeout, dlock.DefaultTTL)
}

const rootLong = `dlock takes distributed locks from the shell.

  dlock run [flags] KEY -- COMMAND [ARGS...]   run COMMAND while holding the lock KEY
      --permits N                              ... one of N permits: at most N at once
      --shared                                 ... a read hold: shared runs overlap
  dlock leader run KEY -- COMMAND [ARGS...]    run COMMAND while leader of the election KEY
  dlock leader show KEY [--json]               print KEY's leader: value, term, owner, TTL
  dlock leader watch KEY [--json]              print each change of KEY's leader
  dlock inspect KEY [--json]                   show who holds KEY (lock, permits, readers)
  dlock release KEY --owner OWNER | --force    release a lock
  dlock demo                                   oversell, fencing, watchdog, Redlock, backends:
                                               a guided tour on throwaway local servers
  dlock verify [--faults pause,kill,...]       measure a backend's safety under faults

Backend URLs (--backend, or $DLOCK_BACKEND; default ` + defaultBackend + `):
` + "{{schemes}}" + `
Exit codes:
  0    success (run: the command's own exit code is passed through)
  1    the operation failed (release refused, a demo part misbehaved, backend not in this build)
  2    usage error: bad flag, argument, duration or backend URL
  2    also: the lock server could not be reached, did not answer within --timeout,
       or answered the connection with an error; the backend does not support
       --permits, --shared or leader election; --permits disagrees with KEY's holders
  3    leader show: the election has no leader
  75   run: the lock (all permits, the leadership) is held by others (--conflict-exit-code)
  76   run: the lease was lost while the command ran (--lost-exit-code)
  126, 127  run: the command could not be executed / was not found
  128+N     run: the command was killed by signal N`

func schemeHelp() string {
	var b strings.Builder
	for _, s := range schemes {
		fmt.Fprintf(&b, "  %s\n", s.form)
	}
	return b.String()
}

// newRootCmd builds the command tree writing to stdout and stderr, with
// the global flags stored in g.
func newRootCmd(g *globals, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "dlock",
		Short:         "Distributed locks from the shell",
		Long:          strings.Replace(rootLong, "{{schemes}}", schemeHelp(), 1),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		// A bare `dlock` prints the help and exits 0.
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return usageErrorf("%v", err)
	})

	def := os.Getenv("DLOCK_BACKEND")
	if def == "" {
		def = defaultBackend
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.backend, "backend", def, "lock server URL (see Backend URLs above); $DLOCK_BACKEND sets the default")
	pf.DurationVar(&g.timeout, "timeout", 5*time.Second, "bound for connecting and for each server operation")

	root.AddCommand(
		newRunCmd(g),
		newLeaderCmd(g),
		newInspectCmd(g),
		newReleaseCmd(g),
		newDemoCmd(g),
		newDemoWorkerCmd(),
		newVerifyCmd(g),
		newVerifyWorkerCmd(),
	)
	return root
}

// execute runs the command line args and returns the process exit code.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{}
	root := newRootCmd(g, stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	g.stopMetrics()
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	if msg := message(err); msg != "" {
		fmt.Fprintln(stderr, msg)
	}
	var ee *exitError
	if !errors.As(err, &ee) && cmd != nil {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}
