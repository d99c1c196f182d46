package etcdlock_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
)

// The helper process: the test binary run again with helperEnv set, so
// that a lock holder can be killed with SIGKILL like a crashed program.
const (
	helperEnv       = "ETCDLOCK_TEST_HELPER"
	helperEndpoints = "ETCDLOCK_TEST_ENDPOINTS"
	helperKey       = "ETCDLOCK_TEST_KEY"
	helperKind      = "ETCDLOCK_TEST_KIND" // "permit" (a semaphore of 1) or "read"; else a lock
)

// TestHelperProcess is not a test: it runs only in a helper process
// (helperEnv set), acquires the lock helperKey with TTL ttl, prints
// "HELD <fence>" and holds the lock (renewed by the watchdog) until it is
// killed.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper process only")
	}
	cli := newCli(t, strings.Split(os.Getenv(helperEndpoints), ","))
	c := dlock.New(etcdlock.New(cli), dlock.WithTTL(ttl))
	var (
		l   *dlock.Lease
		err error
	)
	switch key := os.Getenv(helperKey); os.Getenv(helperKind) {
	case "permit":
		l, err = c.Semaphore(key, 1).Acquire(context.Background())
	case "read":
		l, err = c.RWLock(key).RLock(context.Background())
	default:
		l, err = c.Acquire(context.Background(), key)
	}
	if err != nil {
		fmt.Printf("ERROR %v\n", err)
		os.Exit(2)
	}
	fmt.Printf("HELD %d\n", l.Fence())
	<-l.Done() // until killed; a lost lease ends the helper
	fmt.Printf("LOST %v\n", l.Err())
	os.Exit(3)
}

// startHolder starts a helper process holding key and returns it once it
// reported the lock held, with its fence. The process is killed (by PID)
// at the end of the test if still running.
func startHolder(t *testing.T, eps []string, key string) (*exec.Cmd, uint64) {
	t.Helper()
	return startHolderKind(t, eps, key, "")
}

// startHolderKind is startHolder for a hold of kind ("permit": one of a
// semaphore of 1; "read": a read hold; "": the lock).
func startHolderKind(t *testing.T, eps []string, key, kind string) (*exec.Cmd, uint64) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		helperKind+"="+kind,
		helperEnv+"=1",
		helperEndpoints+"="+strings.Join(eps, ","),
		helperKey+"="+key)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "HELD ") || strings.HasPrefix(line, "ERROR ") {
				lines <- line
			}
		}
		close(lines)
	}()
	select {
	case line, ok := <-lines:
		if !ok || !strings.HasPrefix(line, "HELD ") {
			t.Fatalf("helper: got %q, want HELD <fence>", line)
		}
		var fence uint64
		fmt.Sscanf(line, "HELD %d", &fence)
		return cmd, fence
	case <-time.After(20 * time.Second):
		t.Fatal("helper did not report the lock held within 20s")
	}
	return nil, 0
}
