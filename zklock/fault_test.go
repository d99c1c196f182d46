package zklock_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/zklock"
	"github.com/go-zookeeper/zk"
)

// startServer starts a ZooKeeper server of the test's own, for faults
// that must not disturb the shared one.
func startServer(t *testing.T) *testserver.ZooKeeper {
	t.Helper()
	srv, err := testserver.StartZooKeeper(testserver.ZooKeeperOptions{TickTime: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("StartZooKeeper: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return srv
}

// TestServerStoppedLongerThanSession stops the server (SIGKILL) during a
// hold for longer than the session timeout: the lease must end (Done
// closes, ErrLost) within the TTL (= session timeout) plus one second,
// while the server is still down; once it is back, another session takes
// the lock with a higher fence.
func TestServerStoppedLongerThanSession(t *testing.T) {
	const session = 2 * time.Second
	srv := startServer(t)
	c, _ := client(t, srv.Addr(), session)
	ctx := locktest.Ctx(t, time.Minute)
	l := locktest.MustAcquire(t, ctx, c, locktest.Key(t))
	work, cancel := l.Context(context.Background())
	defer cancel()

	stopped := time.Now()
	if err := srv.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	select {
	case <-l.Done():
	case <-time.After(session + time.Second):
		t.Fatalf("lease not ended %v after the server stopped (session timeout %v)", session+time.Second, session)
	}
	lostAfter := time.Since(stopped)
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err: got %v, want ErrLost", err)
	}
	if err := context.Cause(work); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("lease context cause: got %v, want ErrLost", err)
	}
	t.Logf("lease lost %v after the server was killed (session timeout %v)", lostAfter.Round(time.Millisecond), session)

	// The fault: the server stays down past the session timeout, then
	// comes back.
	time.Sleep(time.Until(stopped.Add(session + 500*time.Millisecond)))
	if err := srv.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	restarted := time.Now()
	c2, _ := client(t, srv.Addr(), session)
	l2 := locktest.MustAcquire(t, ctx, c2, l.Key())
	t.Logf("lock taken by another session %v after the restart", time.Since(restarted).Round(time.Millisecond))
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence after the outage: got %d, want > %d", l2.Fence(), l.Fence())
	}
	if err := l.Release(ctx); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Release of the lost lease: got %v, want ErrLost", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestDisconnectIsSuspended pauses the server long enough for the client
// to drop the connection, but less than the session timeout: the lease
// must survive (Disconnected is "suspended"), and renew once reconnected.
func TestDisconnectIsSuspended(t *testing.T) {
	const session = 10 * time.Second // recvTimeout 2/3 × 10s: the client disconnects after 6.7s
	var sawDisconnect atomic.Bool
	record := zklock.WithConnOptions(zk.WithEventCallback(func(ev zk.Event) {
		if ev.Type == zk.EventSession && ev.State == zk.StateDisconnected {
			sawDisconnect.Store(true)
		}
	}))
	_, b := connect(t, zkServer.Addr(), session, record)
	c := dlock.New(b, dlock.WithTTL(session))
	defer c.Close()
	ctx := locktest.Ctx(t, time.Minute)
	k := locktest.Key(t)
	l := locktest.MustAcquire(t, ctx, c, k)
	defer l.Release(context.Background())
	if err := l.Refresh(ctx, 0); err != nil { // Expires ≈ now + 10s
		t.Fatalf("Refresh: %v", err)
	}
	if err := zkServer.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	time.Sleep(7500 * time.Millisecond) // the fault: longer than recvTimeout, shorter than the session
	if err := zkServer.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if !sawDisconnect.Load() {
		t.Fatal("the connection never went Disconnected: the test did not exercise a disconnection")
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := l.Refresh(rctx, 0); err != nil {
		t.Fatalf("Refresh after reconnecting: %v (lease Err %v)", err, l.Err())
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease after a disconnection shorter than the session: got %v, want nil", err)
	}
	other, _ := client(t, zkServer.Addr(), session)
	if _, err := other.TryAcquire(ctx, k); !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire by another session: got %v, want ErrNotAcquired", err)
	}
}

// ---------------------------------------------------------------------------
// Holder process killed

const helperEnv = "ZKLOCK_TEST_HELPER"

// TestHelperProcess is not a test: TestHolderProcessKilled runs the test
// binary again with helperEnv set to run it as a lock-holding process.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "hold" {
		t.Skip("runs only as a helper process")
	}
	addr, k := os.Getenv("ZKLOCK_TEST_ADDR"), os.Getenv("ZKLOCK_TEST_KEY")
	session, err := time.ParseDuration(os.Getenv("ZKLOCK_TEST_SESSION"))
	if err != nil {
		t.Fatal(err)
	}
	_, b, err := zklock.Connect([]string{addr}, session, zklock.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(b, dlock.WithTTL(session))
	var l *dlock.Lease
	switch os.Getenv("ZKLOCK_TEST_KIND") {
	case "permit":
		l, err = c.Semaphore(k, 1).Acquire(context.Background())
	case "read":
		l, err = c.RWLock(k).RLock(context.Background())
	default:
		l, err = c.Acquire(context.Background(), k)
	}
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("HELD %d\n", l.Fence())
	// Until SIGKILLed. A lost lease ends the helper: if the test binary
	// dies instead, its ZooKeeper server dies with it and the session ends.
	<-l.Done()
	t.Fatalf("lease lost before the helper was killed: %v", l.Err())
}

// TestHolderProcessKilled SIGKILLs a process holding the lock (session
// timeout 2s): the next waiter must get the lock within the session
// timeout plus one second.
func TestHolderProcessKilled(t *testing.T) { holderKilled(t, dlock.KindLock) }

// TestKindHolderProcessKilled does the same with a process holding the
// only permit of a semaphore (the next waiter takes the permit), and one
// holding a read hold (a writer waits for it).
func TestKindHolderProcessKilled(t *testing.T) {
	t.Run("permit", func(t *testing.T) { holderKilled(t, dlock.KindPermit) })
	t.Run("read", func(t *testing.T) { holderKilled(t, dlock.KindRead) })
}

func holderKilled(t *testing.T, kind dlock.Kind) {
	const session = 2 * time.Second
	k := locktest.Key(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(),
		helperEnv+"=hold",
		"ZKLOCK_TEST_ADDR="+zkServer.Addr(),
		"ZKLOCK_TEST_KEY="+k,
		"ZKLOCK_TEST_KIND="+kind.String(),
		"ZKLOCK_TEST_SESSION="+session.String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	held := make(chan uint64, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if f, ok := strings.CutPrefix(s.Text(), "HELD "); ok {
				n, _ := strconv.ParseUint(f, 10, 64)
				held <- n
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill() // by PID; a no-op once it has exited
		<-drained
		cmd.Wait()
	})
	var helperFence uint64
	select {
	case helperFence = <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("helper process did not report holding the lock")
	}

	// The waiter's own session and TTL are longer: only the holder's
	// session timeout is measured.
	c, b := client(t, zkServer.Addr(), 10*time.Second)
	obs := observer(t, zkServer.Addr())
	ctx := locktest.Ctx(t, time.Minute)
	wait := locktest.Go(func() (*dlock.Lease, error) {
		if kind == dlock.KindPermit {
			return c.Semaphore(k, 1).Acquire(ctx)
		}
		return c.Acquire(ctx, k) // a writer, behind a reader
	})
	awaitQueue(t, obs, b.KeyPath(k), 2)
	killed := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("SIGKILL helper (pid %d): %v", cmd.Process.Pid, err)
	}
	l := locktest.Granted(t, wait, time.Minute)
	took := time.Since(killed)
	defer l.Release(context.Background())
	t.Logf("next waiter acquired %v after the %s holder process was SIGKILLed (session timeout %v)", took.Round(time.Millisecond), kind, session)
	if limit := session + time.Second; took > limit {
		t.Fatalf("next waiter acquired %v after the kill, want within %v", took, limit)
	}
	if l.Fence() <= helperFence {
		t.Fatalf("fence: got %d, want > the killed holder's %d", l.Fence(), helperFence)
	}
}

// ---------------------------------------------------------------------------
// Lost create reply

// cutProxy forwards ZooKeeper connections to a server; when armed, it
// forwards the next create request but drops the connection instead of
// forwarding its reply, so the client sees ErrConnectionClosed for a
// create the server did apply.
type cutProxy struct {
	ln     net.Listener
	target string
	armed  atomic.Bool
	cuts   atomic.Int32
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func startProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var cutXid atomic.Int64 // the xid whose reply to drop; xids ≥ 0, -1 and -2 are events and pings
		cutXid.Store(math.MinInt64)
		closeBoth := func() { c.Close(); s.Close() }
		p.wg.Add(2)
		go func() { // client → server
			defer p.wg.Done()
			defer closeBoth()
			for first := true; ; first = false {
				frame, err := readFrame(c)
				if err != nil {
					return
				}
				// Requests after the ConnectRequest: int32 xid, int32 opcode
				// (1 create, 14 multi: zklock creates lock nodes in a multi).
				if op := opcode(frame, first); (op == 1 || op == 14) && p.armed.CompareAndSwap(true, false) {
					cutXid.Store(int64(int32(binary.BigEndian.Uint32(frame[4:8]))))
				}
				if _, err := s.Write(frame); err != nil {
					return
				}
			}
		}()
		go func() { // server → client
			defer p.wg.Done()
			defer closeBoth()
			for first := true; ; first = false {
				frame, err := readFrame(s)
				if err != nil {
					return
				}
				// Replies after the ConnectResponse start with int32 xid.
				if !first && len(frame) >= 8 && int64(int32(binary.BigEndian.Uint32(frame[4:8]))) == cutXid.Load() {
					p.cuts.Add(1)
					return // drop the reply and the connection
				}
				if _, err := c.Write(frame); err != nil {
					return
				}
			}
		}()
	}
}

// opcode returns the opcode of a request frame, -1 for the ConnectRequest.
func opcode(frame []byte, first bool) int32 {
	if first || len(frame) < 12 {
		return -1
	}
	return int32(binary.BigEndian.Uint32(frame[8:12]))
}

// readFrame reads one length-prefixed frame, prefix included.
func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > 4<<20 {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	frame := make([]byte, 4+n)
	copy(frame, hdr[:])
	_, err := io.ReadFull(r, frame[4:])
	return frame, err
}

// TestLostCreateReplyIsRecovered drops the reply of the lock node's
// create (the server applied it): the acquisition must find its node by
// its guid prefix once reconnected, not create a second one.
func TestLostCreateReplyIsRecovered(t *testing.T) {
	p := startProxy(t, zkServer.Addr())
	obs := observer(t, zkServer.Addr())
	for _, mode := range []string{"Acquire", "TryAcquire"} {
		t.Run(mode, func(t *testing.T) {
			const session = 5 * time.Second // reconnecting takes go-zookeeper about 1s
			_, b := connect(t, p.Addr(), session)
			c := dlock.New(b, dlock.WithTTL(session))
			defer c.Close()
			ctx := locktest.Ctx(t, time.Minute)
			k := locktest.Key(t)
			// First use creates the queue node (containers survive the
			// test); the cut must hit the lock node's create.
			warm, err := c.TryAcquire(ctx, k)
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			if err := warm.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}

			cuts := p.cuts.Load()
			p.armed.Store(true)
			acquire := c.Acquire
			if mode == "TryAcquire" {
				acquire = c.TryAcquire
			}
			l, err := acquire(ctx, k)
			if err != nil {
				t.Fatalf("%s with the create reply lost: %v", mode, err)
			}
			if got := p.cuts.Load() - cuts; got != 1 {
				t.Fatalf("replies dropped: got %d, want 1", got)
			}
			children, _, err := obs.Children(b.KeyPath(k))
			if err != nil {
				t.Fatalf("Children: %v", err)
			}
			if len(children) != 1 {
				t.Fatalf("queue after a lost create reply: got %v, want exactly one node", children)
			}
			_, st, err := obs.Get(b.KeyPath(k) + "/" + children[0])
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if uint64(st.Czxid) != l.Fence() {
				t.Fatalf("held node czxid %d, lease fence %d: want the same node", st.Czxid, l.Fence())
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			awaitQueue(t, obs, b.KeyPath(k), 0)
		})
	}
}
