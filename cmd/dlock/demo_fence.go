package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
)

// Part (b): a holder is frozen (SIGSTOP: a GC pause, a VM migration, a
// swap storm) past its TTL. Another holder takes the lock over and writes.
// Then the frozen one wakes up and, believing it still holds the lock,
// writes too. A store that ignores fencing tokens accepts the stale write
// and loses the newer one; a fenced store (fence.Redis) rejects it.
//
// The frozen holder must be a separate process: freezing a goroutine would
// not freeze the watchdog that renews its lease. The demo re-runs its own
// executable with the hidden demo-worker command.
const fenceTTL = time.Second

// The keys of part (b): the lock, the unfenced store and the fenced store.
const (
	fencingLockKey   = "demo:b:report"
	fencingPlainKey  = "demo:b:store:plain"
	fencingFencedKey = "demo:b:store:fenced"
)

// workerMsg is a line the demo worker prints on stdout.
type workerMsg struct {
	Event  string `json:"event"` // "acquired" or "wrote"
	Fence  uint64 `json:"fence,omitempty"`
	Owner  string `json:"owner,omitempty"`
	Plain  string `json:"plain,omitempty"`  // outcome of the unfenced write: "accepted" or an error
	Fenced string `json:"fenced,omitempty"` // outcome of the fenced write: "accepted", "rejected: ..." or an error
	Stale  bool   `json:"stale,omitempty"`  // the fenced write was rejected as stale
	Lease  string `json:"lease,omitempty"`  // the worker's view of its lease after writing
	Error  string `json:"error,omitempty"`
}

// partFencing runs part (b): worker A freezes past its lease, holder B
// takes over and writes, A wakes up and writes its stale report; the
// unfenced store accepts it, the fenced store rejects it.
func partFencing(ctx context.Context, env *demoEnv, r *partResult) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	d := &fencingDemo{env: env, r: r, rdb: env.redisNode(env.redis.Addr(), 4)}
	defer d.close()
	if d.startA(ctx) && d.freezeA() && d.takeOverB(ctx) && d.wakeA() {
		d.compareStores(ctx)
	}
}

// fencingDemo is the state of part (b) from one phase to the next.
type fencingDemo struct {
	env *demoEnv
	r   *partResult
	rdb *redis.Client

	w      *worker   // worker A's process
	a      workerMsg // A's grant
	frozen time.Time // when A was frozen

	client *dlock.Client // holder B's
	lease  *dlock.Lease  // B's lease
	store  *fence.Redis  // the fenced store
	bPlain string        // B's report
	res    workerMsg     // A's writes after waking
}

// close closes B's client, stops worker A and closes the Redis client.
func (d *fencingDemo) close() {
	if d.client != nil {
		d.client.Close()
	}
	if d.w != nil {
		d.w.stop()
	}
	d.rdb.Close()
}

// startA empties both stores and starts worker A, which takes the lock.
// It returns false, with r failed, if A did not take it.
func (d *fencingDemo) startA(ctx context.Context) bool {
	r := d.r
	if err := d.rdb.Del(ctx, fencingPlainKey, fencingFencedKey).Err(); err != nil {
		r.fail("%v", err)
		r.Summary = "error: " + err.Error()
		return false
	}
	w, err := startWorker(ctx, d.env.redis.Addr(), fencingLockKey, fencingPlainKey, fencingFencedKey)
	if err != nil {
		r.fail("worker A: %v", err)
		r.Summary = "error: worker did not start"
		return false
	}
	d.w = w
	d.a, err = w.next(10 * time.Second)
	if err != nil || d.a.Event != "acquired" {
		r.fail("worker A did not take the lock: %v %s", err, d.a.Error)
		r.Summary = "error: worker did not take the lock"
		return false
	}
	r.detail("worker A (pid %d) holds %q with fence %d, TTL %v", w.cmd.Process.Pid, fencingLockKey, d.a.Fence, fenceTTL)
	r.detail("(Redis fences are the server time in µs, kept above the last grant's: they keep growing even if Redis restarts empty)")
	return true
}

// freezeA stops worker A's process and queues its write, which A makes
// the moment it wakes up.
func (d *fencingDemo) freezeA() bool {
	if err := stopProcess(d.w.cmd.Process); err != nil {
		d.r.fail("SIGSTOP worker A: %v", err)
		d.r.Summary = "error: cannot freeze the worker"
		return false
	}
	d.frozen = time.Now()
	if _, err := io.WriteString(d.w.stdin, "write\n"); err != nil {
		_ = continueProcess(d.w.cmd.Process)
		d.r.fail("worker A: %v", err)
		return false
	}
	return true
}

// takeOverB has holder B take the lock once A's lease expires (A cannot
// renew it) and write its report to both stores.
func (d *fencingDemo) takeOverB(ctx context.Context) bool {
	r := d.r
	b, err := newRedisBackend(d.rdb)
	if err != nil {
		_ = continueProcess(d.w.cmd.Process)
		r.fail("%v", err)
		return false
	}
	d.client = dlock.New(b, d.env.g.clientOptions(dlock.WithTTL(10*time.Second))...)
	wctx, wcancel := context.WithTimeout(ctx, 10*fenceTTL)
	d.lease, err = d.client.Acquire(wctx, fencingLockKey)
	wcancel()
	if err != nil {
		_ = continueProcess(d.w.cmd.Process)
		r.fail("holder B could not take the lock after A froze: %v", err)
		r.Summary = "error: no takeover"
		return false
	}
	r.detail("worker A frozen (SIGSTOP); %v later its lease expired and holder B took the lock with fence %d",
		time.Since(d.frozen).Round(10*time.Millisecond), d.lease.Fence())
	d.store = fence.NewRedis(d.rdb)
	d.bPlain = fmt.Sprintf("report by B (fence %d)", d.lease.Fence())
	errPlain := d.rdb.Set(ctx, fencingPlainKey, d.bPlain, 0).Err()
	errFenced := d.store.Set(ctx, fencingFencedKey, d.bPlain, d.lease.Fence(), d.lease.Owner())
	if errPlain != nil || errFenced != nil {
		_ = continueProcess(d.w.cmd.Process)
		r.fail("holder B's writes failed: %v", errors.Join(errPlain, errFenced))
		return false
	}
	r.detail("holder B wrote %q to both stores", d.bPlain)
	return true
}

// wakeA resumes worker A and reads the outcome of its stale writes.
func (d *fencingDemo) wakeA() bool {
	r := d.r
	if err := continueProcess(d.w.cmd.Process); err != nil {
		r.fail("SIGCONT worker A: %v", err)
		return false
	}
	var err error
	d.res, err = d.w.next(15 * time.Second)
	if err != nil || d.res.Event != "wrote" {
		r.fail("worker A after waking: %v %s", err, d.res.Error)
		r.Summary = "error: worker A did not report its writes"
		return false
	}
	r.detail("worker A woke up after %v frozen and wrote its stale report (fence %d) to both stores",
		time.Since(d.frozen).Round(10*time.Millisecond), d.a.Fence)
	return true
}

// compareStores releases B's lease, reads both stores and checks that the
// unfenced one took A's stale write and the fenced one kept B's.
func (d *fencingDemo) compareStores(ctx context.Context) {
	r, a, lease, res := d.r, d.a, d.lease, d.res
	_ = lease.Release(ctx)

	plainNow, err1 := d.rdb.Get(ctx, fencingPlainKey).Result()
	fencedNow, highest, err2 := d.store.Get(ctx, fencingFencedKey)
	if err := errors.Join(err1, err2); err != nil {
		r.fail("reading the stores: %v", err)
		return
	}
	r.detail("  unfenced store: A's write %s; it now holds %q  <- B's newer report is LOST", res.Plain, plainNow)
	r.detail("  fenced store:   A's write %s; it still holds %q (highest fence %d)", res.Fenced, fencedNow, highest)
	r.fact("fence_a", a.Fence)
	r.fact("fence_b", lease.Fence())
	r.fact("unfenced_value", plainNow)
	r.fact("fenced_value", fencedNow)
	r.fact("fenced_rejected", res.Stale)

	aPlain := fmt.Sprintf("report by A (fence %d)", a.Fence)
	switch {
	case lease.Fence() <= a.Fence:
		r.fail("B's fence %d is not greater than A's %d", lease.Fence(), a.Fence)
	case plainNow != aPlain:
		r.fail("the unfenced store holds %q, want A's stale write %q", plainNow, aPlain)
	case !res.Stale:
		r.fail("the fenced store did not reject A's stale write: %s", res.Fenced)
	case fencedNow != d.bPlain:
		r.fail("the fenced store holds %q, want B's %q", fencedNow, d.bPlain)
	}
	r.Summary = fmt.Sprintf("stale write (fence %d < %d): unfenced store accepted it, fenced store rejected it", a.Fence, lease.Fence())
}

// worker is a running demo-worker process.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan workerMsg
	stderr *bytes.Buffer
	done   chan struct{}
}

func startWorker(ctx context.Context, addr, lockKey, plainKey, fencedKey string) (*worker, error) {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	w := &worker{lines: make(chan workerMsg, 4), stderr: &bytes.Buffer{}, done: make(chan struct{})}
	w.cmd = exec.CommandContext(ctx, exe, "demo-worker",
		"--redis", addr, "--key", lockKey, "--ttl", fenceTTL.String(),
		"--plain", plainKey, "--fenced", fencedKey, "--name", "A")
	w.cmd.Stderr = w.stderr
	w.cmd.WaitDelay = time.Second
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var m workerMsg
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				w.lines <- m
			}
		}
	}()
	return w, nil
}

// next waits up to timeout for the worker's next message.
func (w *worker) next(timeout time.Duration) (workerMsg, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case m, ok := <-w.lines:
		if !ok {
			return workerMsg{}, fmt.Errorf("worker exited: %s", strings.TrimSpace(w.stderr.String()))
		}
		return m, nil
	case <-t.C:
		return workerMsg{}, fmt.Errorf("no answer from the worker within %v", timeout)
	}
}

// stop ends the worker (thawing it first if it is frozen) and waits.
func (w *worker) stop() {
	_ = w.stdin.Close()
	_ = continueProcess(w.cmd.Process)
	exited := make(chan struct{})
	go func() {
		_ = w.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = w.cmd.Process.Kill()
		<-exited
	}
	for range w.lines {
	}
}

// newDemoWorkerCmd is the hidden command part (b) runs as holder A.
func newDemoWorkerCmd() *cobra.Command {
	var addr, key, plainKey, fencedKey, name string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:    "demo-worker",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return demoWorker(cmd.Context(), addr, key, ttl, plainKey, fencedKey, name, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&addr, "redis", "", "redis address")
	fl.StringVar(&key, "key", "", "lock key")
	fl.DurationVar(&ttl, "ttl", time.Second, "lease TTL")
	fl.StringVar(&plainKey, "plain", "", "unfenced store key")
	fl.StringVar(&fencedKey, "fenced", "", "fenced store key")
	fl.StringVar(&name, "name", "A", "holder name")
	return cmd
}

// demoWorker takes the lock, reports its fence, waits for a line on stdin
// and then writes to both stores as if it still held the lock.
func demoWorker(ctx context.Context, addr, key string, ttl time.Duration, plainKey, fencedKey, name string, in io.Reader, out io.Writer) error {
	enc := json.NewEncoder(out)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := newRedisBackend(rdb)
	if err != nil {
		_ = enc.Encode(workerMsg{Event: "error", Error: err.Error()})
		return exitWith(exitFailure, err)
	}
	client := dlock.New(b, dlock.WithTTL(ttl))
	defer client.Close()
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	lease, err := client.Acquire(actx, key)
	cancel()
	if err != nil {
		_ = enc.Encode(workerMsg{Event: "error", Error: err.Error()})
		return exitWith(exitFailure, err)
	}
	_ = enc.Encode(workerMsg{Event: "acquired", Fence: lease.Fence(), Owner: lease.Owner()})

	// Wait for the go-ahead (sent while this process is frozen).
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && line == "" {
		_ = lease.Release(context.Background())
		return nil
	}
	value := fmt.Sprintf("report by %s (fence %d)", name, lease.Fence())
	msg := workerMsg{Event: "wrote", Plain: "accepted", Fenced: "accepted"}
	// Right after SIGCONT go-redis may see a spurious i/o timeout (its
	// clock lags): retry a timed-out write.
	if err := retryTimeout(func() error { return rdb.Set(ctx, plainKey, value, 0).Err() }); err != nil {
		msg.Plain = "failed: " + err.Error()
	}
	err = retryTimeout(func() error {
		return fence.NewRedis(rdb).Set(ctx, fencedKey, value, lease.Fence(), lease.Owner())
	})
	switch {
	case errors.Is(err, fence.ErrStale):
		msg.Fenced, msg.Stale = "was rejected with fence.ErrStale", true
		var se *fence.StaleError
		if errors.As(err, &se) {
			msg.Fenced = fmt.Sprintf("was rejected with fence.ErrStale (fence %d < %d)", se.Fence, se.Highest)
		}
	case err != nil:
		msg.Fenced = "failed: " + err.Error()
	default:
		msg.Fenced = "was accepted"
	}
	if msg.Plain == "accepted" {
		msg.Plain = "was accepted"
	}
	msg.Lease = "held"
	if err := lease.Err(); err != nil {
		msg.Lease = trim(err)
	}
	_ = enc.Encode(msg)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = lease.Release(rctx)
	rcancel()
	return nil
}

func retryTimeout(f func() error) error {
	var err error
	for range 3 {
		if err = f(); err == nil || !isTimeout(err) {
			return err
		}
	}
	return err
}
