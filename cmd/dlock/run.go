package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock"
)

type runFlags struct {
	ttl          time.Duration
	wait         waitValue
	conflictCode int
	lostCode     int
	grace        time.Duration
	owner        string
	fifo         bool
	quiet        bool

	permits    int    // --permits: hold one of this many permits (kinds.go)
	permitsSet bool   // --permits was given
	shared     bool   // --shared: hold a read hold
	leader     bool   // dlock leader run: hold the leadership
	value      string // dlock leader run --value
}

const runLong = `Run COMMAND while holding the lock KEY: a distributed flock(1).

dlock takes the lock, runs COMMAND with these variables added to its environment:

  DLOCK_KEY      the lock's key
  DLOCK_FENCE    the fencing token: a number that grows with every grant of KEY.
                 Pass it to the resource you write to and let it reject fences older
                 than one it has seen (see the fence package).
  DLOCK_OWNER    the owner token of this hold
  DLOCK_BACKEND  the backend URL, so that the command can run dlock itself

renews the lease every TTL/3 while COMMAND runs, releases the lock when COMMAND exits,
and exits with COMMAND's exit status (128+N if signal N killed it).

If the lock is held by another owner, dlock waits up to --wait (default 0: give up at
once; a wait is announced on stderr unless --quiet) and then exits with
--conflict-exit-code (75) without running COMMAND.

If the lease is lost while COMMAND runs (the server stopped answering until the lease
could have expired, or an administrator force-released the lock), dlock prints a
message naming KEY, sends SIGTERM to COMMAND's process group, SIGKILL after --grace,
and exits with --lost-exit-code (76). It does the same when it finds the lease lost as
it releases the lock after COMMAND exited.

SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlock are forwarded to
COMMAND's process group; the lock is released once COMMAND exits. A signal that arrives
while dlock is still waiting for the lock ends the wait (exit 128+N). On Linux, if dlock
itself is killed (SIGKILL, the OOM killer), COMMAND's process is killed too (SIGKILL):
nobody would renew the lease, and another host could soon run it alongside. Processes
that COMMAND starts are not killed with it: in a script, exec the program that does the
work, so that it is COMMAND's process.

In a terminal COMMAND runs in the foreground: it reads the terminal, and Ctrl-C reaches
it directly. Ctrl-Z stops COMMAND and dlock with it, and the shell's fg or bg continues
both. A stopped dlock renews nothing: stopped for longer than the TTL, it finds the lock
lost when continued and stops COMMAND as above (exit 76).

Instead of the lock, run can hold (on backends that support it; others refuse with
exit 2):

  --permits N    one of N permits of the semaphore KEY: at most N commands run at once.
                 Every holder of KEY must give the same N (else exit 2). DLOCK_PERMITS
                 is set to N; each permit has its own DLOCK_FENCE. With --owner: exit 2
                 (permits are not reentrant).
  --shared       a read hold of the read-write lock KEY: shared runs overlap one
                 another, but never a plain run of KEY (the write side). A plain run
                 waiting for KEY keeps new shared runs out. With --owner: exit 2.

The wait, conflict, loss and signal rules above apply to every kind of hold. To run a
command while leader of an election, see dlock leader run.`

const runExample = `  # crontab: the nightly report runs on one host of the fleet at a time; other hosts
  # skip it quietly (exit 75) while it runs elsewhere.
  DLOCK_BACKEND=redis://locks.internal:6379
  0 2 * * *  dlock run --quiet --ttl 1m report:nightly -- /usr/local/bin/nightly-report

  # Wait up to 10 minutes for the lock, pass the fencing token on.
  dlock run --wait 10m db:migrate -- sh -c 'migrate --fence "$DLOCK_FENCE"'

  # At most 3 hosts call the payment provider's batch API at once; the others wait.
  dlock run --permits 3 --wait forever payments:batch -- ./settle

  # Readers of the config run side by side; the migration runs alone.
  dlock run --shared --wait 1m config -- ./render-config
  dlock run --wait 10m config -- ./migrate-config`

func newRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:     "run [flags] KEY -- COMMAND [ARGS...]",
		Short:   "Run a command while holding a lock",
		Long:    runLong,
		Example: runExample,
		Args:    runArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCommand(cmd.Context(), g, f, args[0], args[1:], cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", dlock.DefaultTTL, "lease lifetime; renewed every TTL/3 while the command runs; a crashed dlock keeps the lock at most this long")
	fl.Var(&f.wait, "wait", `how long to wait for a lock held elsewhere: a duration, 0 (give up at once) or "forever"`)
	fl.IntVar(&f.conflictCode, "conflict-exit-code", exitConflict, "exit code when the lock is held by another owner")
	fl.IntVar(&f.lostCode, "lost-exit-code", exitLost, "exit code when the lease is lost while the command runs")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "after a lost lease: time between SIGTERM and SIGKILL to the command")
	fl.StringVar(&f.owner, "owner", "", "hold the lock as this owner id (default: a random token per run); a run with the same id re-enters the lock instead of conflicting")
	fl.BoolVar(&f.fifo, "fifo", false, "with --wait: join the server-side queue at once, without a first plain attempt (redis, etcd and ZooKeeper queue every wait anyway; redlock and postgres refuse it)")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "print nothing when the lock is held by another owner")
	g.addMetricsFlag(cmd)
	f.addKindFlags(cmd)
	return cmd
}

// runArgs checks the shape KEY -- COMMAND [ARGS...].
func runArgs(cmd *cobra.Command, args []string) error {
	dash := cmd.ArgsLenAtDash()
	switch {
	case len(args) == 0:
		return usageErrorf("run: missing KEY and -- COMMAND")
	case dash < 0 && len(args) == 1:
		return usageErrorf("run: missing -- COMMAND after the key %q", args[0])
	case dash < 0:
		return usageErrorf("run: missing -- between the key and the command (dlock run KEY -- %s)", args[1])
	case dash == 0:
		return usageErrorf("run: missing KEY before --")
	case dash > 1:
		return usageErrorf("run: takes one KEY before --, got %d", dash)
	case len(args) == 1:
		return usageErrorf("run: missing COMMAND after --")
	}
	if err := dlock.ValidateKey(args[0]); err != nil {
		return usageErrorf("run: %s", trim(err))
	}
	return nil
}

func (f *runFlags) validate() error {
	switch {
	case f.ttl < dlock.MinTTL:
		return usageErrorf("invalid --ttl %v: must be at least %v", f.ttl, dlock.MinTTL)
	case f.grace < 0:
		return usageErrorf("invalid --grace %v: must not be negative", f.grace)
	case f.conflictCode < 0 || f.conflictCode > 255:
		return usageErrorf("invalid --conflict-exit-code %d: must be 0..255", f.conflictCode)
	case f.lostCode < 0 || f.lostCode > 255:
		return usageErrorf("invalid --lost-exit-code %d: must be 0..255", f.lostCode)
	}
	if len(f.owner) > dlock.MaxKeyLen {
		return usageErrorf("invalid --owner: longer than %d bytes", dlock.MaxKeyLen)
	}
	return f.validateKind()
}

var (
	errWaitOver    = errors.New("the --wait time ran out")
	errOpTimeout   = errors.New("the server did not answer within --timeout")
	errInterrupted = errors.New("interrupted")
)

// hold is an acquired lock with what must be closed after it.
type hold struct {
	conn   *conn
	client *dlock.Client
	lease  *dlock.Lease
}

// close releases the lease if still held and closes the client and the
// connection.
func (h *hold) close() {
	if h.client != nil {
		_ = h.client.Close()
	}
	if h.conn != nil {
		_ = h.conn.Close()
	}
}

// runCommand implements `dlock run`.
func runCommand(ctx context.Context, g *globals, f *runFlags, key string, argv []string, stderr io.Writer) error {
	if err := f.validate(); err != nil {
		return err
	}
	spec, err := g.spec()
	if err != nil {
		return err
	}

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)

	// Connect and acquire; a signal ends the wait.
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type result struct {
		h   *hold
		err error
	}
	res := make(chan result, 1)
	go func() {
		h, err := acquire(actx, g, f, spec, key, stderr)
		res <- result{h, err}
	}()
	var h *hold
	select {
	case r := <-res:
		h, err = r.h, r.err
	case sig := <-sigs:
		cancel(errInterrupted)
		if r := <-res; r.h != nil {
			r.h.close()
		}
		return exitWith(128+signalNumber(sig), fmt.Errorf("%s: interrupted by %v while taking %s", f.cmdName(), sig, f.held(key)))
	}
	if err != nil {
		return err
	}
	defer h.close()
	return supervise(g, f, h, key, argv, sigs, stderr)
}

// acquire connects and takes the lock, or returns the error to exit with.
func acquire(ctx context.Context, g *globals, f *runFlags, spec *backendSpec, key string, stderr io.Writer) (*hold, error) {
	c, err := openBackend(ctx, spec, g.timeout, f.ttl)
	if err != nil {
		return nil, err
	}
	h := &hold{conn: c}
	copts := []dlock.Option{dlock.WithTTL(f.ttl)}
	if (f.wait.forever || f.wait.d > 0) && !f.quiet {
		copts = append(copts, dlock.WithObserver(&waitNotice{key: key, wait: f.wait, w: stderr, cmd: f.cmdName(), busy: f.busy(key), until: f.until()}))
	}
	h.client = dlock.New(c.backend, g.clientOptions(copts...)...)
	if err := h.client.Err(); err != nil {
		h.close()
		return nil, usageErrorf("%s: %s", f.cmdName(), trim(err))
	}
	var opts []dlock.Option
	if f.owner != "" {
		opts = append(opts, dlock.WithOwner(f.owner))
	}
	if f.fifo {
		opts = append(opts, dlock.WithFIFO())
	}
	if !f.wait.forever && f.wait.d == 0 {
		tctx, cancel := context.WithTimeoutCause(ctx, g.timeout, errOpTimeout)
		h.lease, err = f.take(tctx, h.client, key, true, opts)
		cancel()
	} else {
		// One attempt bounded by --timeout first, so that a --wait shorter
		// than a round trip (or a slow server) still takes a free lock;
		// then the wait, bounded by --wait, if the lock is held.
		tctx, cancel := context.WithTimeoutCause(ctx, g.timeout, errOpTimeout)
		h.lease, err = f.take(tctx, h.client, key, true, opts)
		cancel()
		if ae := (*dlock.AcquireError)(nil); errors.As(err, &ae) && ae.Cause == nil {
			wctx, cancel := ctx, context.CancelFunc(func() {})
			if !f.wait.forever {
				wctx, cancel = context.WithTimeoutCause(ctx, f.wait.d, errWaitOver)
			}
			h.lease, err = f.take(wctx, h.client, key, false, opts)
			cancel()
		}
	}
	if err == nil {
		return h, nil
	}
	defer h.close()
	var ae *dlock.AcquireError
	switch {
	case errors.As(err, &ae) && (ae.Cause == nil || errors.Is(ae.Cause, errWaitOver)):
		if f.quiet {
			return nil, exitWith(f.conflictCode, nil)
		}
		msg := f.cmdName() + ": " + f.busy(key)
		if holder := describeHolder(h.conn, key, g.timeout); holder != "" {
			msg += " (" + holder + ")"
		}
		if f.wait.d > 0 {
			msg += fmt.Sprintf("; gave up after waiting %v (--wait)", f.wait.d)
		}
		return nil, exitWith(f.conflictCode, errors.New(msg))
	case errors.As(err, &ae) && errors.Is(ae.Cause, errInterrupted):
		return nil, err // the caller reports the signal
	case errors.As(err, &ae) && errors.Is(ae.Cause, errOpTimeout):
		return nil, unavailable(c.kind, c.where, g.timeout, context.DeadlineExceeded)
	case f.kindError(c.kind, key, err) != nil:
		return nil, f.kindError(c.kind, key, err)
	case errors.Is(err, dlock.ErrInvalidTTL), errors.Is(err, dlock.ErrInvalidOption), errors.Is(err, dlock.ErrInvalidKey):
		return nil, usageErrorf("%s: %s", f.cmdName(), trim(err))
	case isConnError(err):
		return nil, unavailable(c.kind, c.where, g.timeout, err)
	}
	return nil, exitWith(exitFailure, err)
}

// waitNotice is a dlock.Observer that says once on stderr that the lock
// is held elsewhere and dlock waits for it: a waiting `dlock run` is not
// mistaken for a hung one.
type waitNotice struct {
	key   string
	wait  waitValue
	w     io.Writer
	cmd   string // "run" or "leader run"
	busy  string // why it waits: "lock "K" is held by another owner", ...
	until string // what --wait forever waits for: "until it is free", ...
	once  sync.Once
}

// Observe prints the notice at the first EventWaitStart of the key.
func (n *waitNotice) Observe(ctx context.Context, e dlock.Event) context.Context {
	if e.Kind == dlock.EventWaitStart && e.Key == n.key {
		n.once.Do(func() {
			how := fmt.Sprintf("up to %v (--wait)", n.wait.d)
			if n.wait.forever {
				how = n.until + " (--wait forever)"
			}
			fmt.Fprintf(n.w, "dlock: %s: %s: waiting %s\n", n.cmd, n.busy, how)
		})
	}
	return ctx
}

// describeHolder returns "owner X, fence F, TTL left T" when the backend
// can inspect locks, else "".
func describeHolder(c *conn, key string, timeout time.Duration) string {
	in, ok := c.backend.(dlock.Inspector)
	if !ok {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	info, err := in.Inspect(ctx, key)
	if err != nil || !info.Held {
		return ""
	}
	if info.Kind != dlock.KindLock {
		return describeHolds(info)
	}
	s := fmt.Sprintf("owner %s, fence %d", info.Owner, info.Fence)
	if info.Value != "" {
		s += fmt.Sprintf(", value %q", info.Value)
	}
	if info.TTL > 0 {
		s += ", TTL left " + info.TTL.Round(time.Millisecond).String()
	}
	return s
}

// isConnError reports whether err is a failure to talk to the server.
func isConnError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// supervise runs the command under the held lease and returns its exit
// status (or the lost code).
func supervise(g *globals, f *runFlags, h *hold, key string, argv []string, sigs <-chan os.Signal, stderr io.Writer) error {
	lease := h.lease
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.Env = append(os.Environ(),
		"DLOCK_KEY="+key,
		"DLOCK_FENCE="+strconv.FormatUint(lease.Fence(), 10),
		"DLOCK_OWNER="+lease.Owner(),
		"DLOCK_BACKEND="+g.backend,
	)
	child.Env = append(child.Env, f.env(lease)...)
	restore, wait := prepareChild(child)
	if err := child.Start(); err != nil {
		restore()
		code := exitNoPerm
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNoExec
		}
		release(g, lease, stderr)
		return exitWith(code, fmt.Errorf("%s: cannot run %q: %w", f.cmdName(), argv[0], err))
	}
	pgid := child.Process.Pid
	exited := make(chan struct{})
	var status int
	go func() {
		status = wait()
		close(exited)
	}()

	var (
		lostErr  error
		done     = lease.Done()
		graceC   <-chan time.Time
		deadline time.Time
	)
loop:
	for {
		select {
		case <-exited:
			break loop
		case sig := <-sigs:
			_ = signalGroup(pgid, sig)
		case <-done:
			done = nil
			lostErr = lease.Err()
			fmt.Fprintf(stderr, "dlock: %s: lost %s while the command ran (%s): sending SIGTERM to the command (process group %d), SIGKILL in %v\n",
				f.cmdName(), f.held(key), trim(lostErr), pgid, f.grace)
			_ = signalGroup(pgid, termSignal)
			continueGroup(pgid) // a stopped command (Ctrl-Z) must get it too
			deadline = time.Now().Add(f.grace)
			t := time.NewTimer(f.grace)
			defer t.Stop()
			graceC = t.C
		case <-graceC:
			graceC = nil
			fmt.Fprintf(stderr, "dlock: %s: the command did not exit within %v (--grace) after losing %s: sending SIGKILL\n", f.cmdName(), f.grace, f.held(key))
			_ = signalGroup(pgid, killSignal)
		}
	}
	restore()

	if lostErr != nil {
		// Processes the command started may still run: give them the rest
		// of the grace period, then kill them.
		for groupAlive(pgid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if groupAlive(pgid) {
			_ = signalGroup(pgid, killSignal)
		}
		forget(lease)
		return exitWith(f.lostCode, fmt.Errorf("%s: the command (exit status %d) was stopped because %s was lost", f.cmdName(), status, f.held(key)))
	}
	if err := release(g, lease, stderr); err != nil {
		return exitWith(f.lostCode, fmt.Errorf("%s: %s was lost before the command finished (%s); the command exited with status %d", f.cmdName(), f.held(key), trim(err), status))
	}
	if status != 0 {
		return exitWith(status, nil)
	}
	return nil
}

// release gives the lock up within --timeout. It returns an error only
// when the lease turns out to have been lost; other failures are reported
// as a warning (the lock then expires by itself within its TTL).
func release(g *globals, lease *dlock.Lease, stderr io.Writer) error {
	if err := lease.Err(); err != nil {
		forget(lease)
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	err := lease.Release(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, dlock.ErrLost), errors.Is(err, dlock.ErrNotHeld):
		return err
	}
	fmt.Fprintf(stderr, "dlock: run: warning: could not release the lock %q (%s); it expires within %v\n", lease.Key(), trim(err), lease.TTL())
	return nil
}

// forget ends the Client's bookkeeping of a lost lease without waiting
// for its server: the lease is gone already (expired, or taken by an
// administrator), and a server that stopped answering would hold the
// release for up to --timeout. The Release call gets a context that is
// already cancelled, so the backend gives up at once instead of waiting
// for an answer; what the server still has expires within the lease's TTL.
func forget(lease *dlock.Lease) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = lease.Release(ctx)
}

// trim drops the "dlock: " prefix of an error for embedding in a message.
func trim(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	for len(s) > 7 && s[:7] == "dlock: " {
		s = s[7:]
	}
	return s
}
