//go:build linux

package testserver_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// Servers shared by the tests, started once by TestMain.
var (
	redisPlain   *testserver.Redis // Persistence: false
	redisDurable *testserver.Redis // Persistence: true
	sentinel     *testserver.Sentinel
	cluster      *testserver.Cluster
	etcd         *testserver.Etcd
	etcdCluster  *testserver.EtcdCluster
	zk           *testserver.ZooKeeper
)

// helperEnv makes the test binary act as a helper process that starts a
// redis-server, prints its PID and waits to be killed.
const helperEnv = "TESTSERVER_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		helperMain()
		return
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	begin := time.Now()
	type starter struct {
		name  string
		start func() error
	}
	starters := []starter{
		{"redis", func() (err error) { redisPlain, err = testserver.StartRedis(testserver.RedisOptions{}); return }},
		{"redis (persistent)", func() (err error) {
			redisDurable, err = testserver.StartRedis(testserver.RedisOptions{Persistence: true})
			return
		}},
		{"sentinel", func() (err error) { sentinel, err = testserver.StartSentinel(); return }},
		{"cluster", func() (err error) { cluster, err = testserver.StartCluster(); return }},
		{"etcd", func() (err error) { etcd, err = testserver.StartEtcd(testserver.EtcdOptions{}); return }},
		{"etcd cluster", func() (err error) { etcdCluster, err = testserver.StartEtcdCluster(3); return }},
		{"zookeeper", func() (err error) { zk, err = testserver.StartZooKeeper(testserver.ZooKeeperOptions{}); return }},
	}
	errs := make([]error, len(starters))
	took := make([]time.Duration, len(starters))
	var wg sync.WaitGroup
	for i, s := range starters {
		wg.Go(func() {
			t0 := time.Now()
			if err := s.start(); err != nil {
				errs[i] = fmt.Errorf("start %s: %w", s.name, err)
			}
			took[i] = time.Since(t0)
		})
	}
	wg.Wait()
	if testing.Verbose() {
		for i, s := range starters {
			fmt.Fprintf(os.Stderr, "TestMain: started %-18s in %v\n", s.name, took[i].Round(time.Millisecond))
		}
		fmt.Fprintf(os.Stderr, "TestMain: all servers up after %v\n", time.Since(begin).Round(time.Millisecond))
	}

	code := 1
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}

	pids := livePIDs()
	t0 := time.Now()
	stopErr := errors.Join(
		testserver.StopAll(redisPlain, redisDurable),
		sentinel.Stop(), cluster.Stop(), etcd.Stop(), etcdCluster.Stop(), zk.Stop(),
	)
	if stopErr != nil {
		fmt.Fprintln(os.Stderr, "TestMain: stop:", stopErr)
		code = 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "TestMain: stopped all servers in %v\n", time.Since(t0).Round(time.Millisecond))
	}
	for _, pid := range pids {
		if processAlive(pid) {
			fmt.Fprintf(os.Stderr, "TestMain: process %d still alive after Stop\n", pid)
			code = 1
		}
	}
	// Once every server is stopped, the package leaves no goroutine behind
	// (its spawner and per-process waiters end with the last process).
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "TestMain: goleak:", err)
		code = 1
	}
	return code
}

// livePIDs returns the PIDs of every shared server that is running.
func livePIDs() []int {
	var pids []int
	add := func(pid int) {
		if pid != 0 {
			pids = append(pids, pid)
		}
	}
	for _, r := range []*testserver.Redis{redisPlain, redisDurable} {
		if r != nil {
			add(r.PID())
		}
	}
	if sentinel != nil {
		for _, r := range append([]*testserver.Redis{sentinel.Primary(), sentinel.Replica()}, sentinel.Sentinels()...) {
			add(r.PID())
		}
	}
	if cluster != nil {
		for _, r := range cluster.Nodes() {
			add(r.PID())
		}
	}
	if etcd != nil {
		add(etcd.PID())
	}
	if etcdCluster != nil {
		for _, e := range etcdCluster.Members() {
			add(e.PID())
		}
	}
	if zk != nil {
		add(zk.PID())
	}
	return pids
}

// processAlive reports whether pid names a process that is neither gone nor
// a zombie (an orphan's zombie lingers if nobody reaps it).
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// ---------------------------------------------------------------------------
// Raw protocol helpers, independent of the package under test.

// respDo sends one RESP command over a new connection. Error replies are
// returned as errors; arrays as []any; bulk and simple strings as string.
func respDo(addr string, timeout time.Duration, args ...string) (any, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	cmd := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		cmd += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c, cmd); err != nil {
		return nil, err
	}
	return respRead(bufio.NewReader(c))
}

func respRead(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return nil, nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return string(b[:n]), nil
	case '*':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			if arr[i], err = respRead(r); err != nil {
				return nil, err
			}
		}
		return arr, nil
	}
	return nil, fmt.Errorf("bad RESP line %q", line)
}

func mustDo(t *testing.T, addr string, args ...string) any {
	t.Helper()
	v, err := respDo(addr, 2*time.Second, args...)
	if err != nil {
		t.Fatalf("%s %v: %v", addr, args, err)
	}
	return v
}

// etcdJSON issues an HTTP request to etcd and decodes the JSON reply.
func etcdJSON(t *testing.T, method, url, body string, out any) error {
	t.Helper()
	b, err := testserver.EtcdHTTP(method, url, body)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

func etcdHealth(t *testing.T, e *testserver.Etcd) error {
	t.Helper()
	var h struct{ Health string }
	if err := etcdJSON(t, "GET", "http://"+e.Endpoints()[0]+"/health", "", &h); err != nil {
		return err
	}
	if h.Health != "true" {
		return fmt.Errorf("health %q", h.Health)
	}
	return nil
}

func zkFourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// zkSession opens a session with a raw ConnectRequest and returns the
// negotiated timeout.
func zkSession(addr string, timeout time.Duration) (time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	b := binary.BigEndian.AppendUint32(nil, 44)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint64(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(timeout.Milliseconds()))
	b = binary.BigEndian.AppendUint64(b, 0)
	b = binary.BigEndian.AppendUint32(b, 16)
	b = append(b, make([]byte, 16)...)
	if _, err := c.Write(b); err != nil {
		return 0, err
	}
	var resp [4 + 4 + 4 + 8]byte
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		return 0, err
	}
	if id := binary.BigEndian.Uint64(resp[12:20]); id == 0 {
		return 0, errors.New("no session id")
	}
	return time.Duration(binary.BigEndian.Uint32(resp[8:12])) * time.Millisecond, nil
}

// within polls check until it returns nil, failing the test with what and
// check's last error if that takes longer than d.
func within(t *testing.T, d time.Duration, what string, check func() error) {
	t.Helper()
	var err error
	if !locktest.Poll(d, func() bool { err = check(); return err == nil }) {
		t.Fatalf("%s: not true after %v: %v", what, d, err)
	}
}

// checkPaused pauses s and fails the test unless probe fails while s is
// paused (with a timeout, if timeout is set); then it resumes s.
func checkPaused(t *testing.T, s interface {
	Pause() error
	Resume() error
}, what string, timeout bool, probe func() error) {
	t.Helper()
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	err := probe()
	var ne net.Error
	if err == nil || timeout && !(errors.As(err, &ne) && ne.Timeout()) {
		s.Resume()
		t.Fatalf("%s while paused: got %v, want a failure (a timeout: %v)", what, err, timeout)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
}

// checkStop stops server s and fails the test if that fails, if its
// process pid is alive or its directory dir is left afterwards, or if
// stopping it again fails. It returns how long the first Stop took.
func checkStop(t *testing.T, s interface{ Stop() error }, pid int, dir string) time.Duration {
	t.Helper()
	t0 := time.Now()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if processAlive(pid) {
		t.Errorf("pid %d alive after Stop", pid)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dir %s after Stop: %v, want removed", dir, err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop = %v, want nil", err)
	}
	return took
}

// ---------------------------------------------------------------------------
// Redis

func TestRedis(t *testing.T) {
	t.Parallel()
	r := redisPlain
	t.Run("PingSetGet", func(t *testing.T) {
		if got := mustDo(t, r.Addr(), "PING"); got != "PONG" {
			t.Fatalf("PING = %v, want PONG", got)
		}
		k := locktest.Key(t)
		if got := mustDo(t, r.Addr(), "SET", k, "v1"); got != "OK" {
			t.Fatalf("SET = %v, want OK", got)
		}
		if got := mustDo(t, r.Addr(), "GET", k); got != "v1" {
			t.Fatalf("GET = %v, want v1", got)
		}
		if !strings.HasPrefix(r.Addr(), "127.0.0.1:") {
			t.Errorf("Addr = %q, want 127.0.0.1:PORT", r.Addr())
		}
		if st, err := os.Stat(r.Dir()); err != nil || !st.IsDir() {
			t.Errorf("Dir %q: %v", r.Dir(), err)
		}
		pgid, err := syscall.Getpgid(r.PID())
		if err != nil || pgid != r.PID() {
			t.Errorf("Getpgid(%d) = %d, %v; want its own group", r.PID(), pgid, err)
		}
		// The package's own Do helper.
		v, err := r.Do(context.Background(), "ECHO", "hi")
		if err != nil || v != "hi" {
			t.Errorf("Do(ECHO hi) = %v, %v; want hi", v, err)
		}
		var rerr testserver.RedisError
		if _, err := r.Do(context.Background(), "NOSUCHCOMMAND"); !errors.As(err, &rerr) {
			t.Errorf("Do(NOSUCHCOMMAND) error = %v, want a RedisError", err)
		}
	})
	t.Run("KillRestartComesBackEmpty", func(t *testing.T) {
		k := locktest.Key(t)
		mustDo(t, r.Addr(), "SET", k, "v")
		addr, oldPID := r.Addr(), r.PID()
		if err := r.Kill(); err != nil {
			t.Fatal(err)
		}
		if processAlive(oldPID) {
			t.Fatalf("pid %d alive after Kill", oldPID)
		}
		if got := r.PID(); got != 0 {
			t.Errorf("PID after Kill = %d, want 0", got)
		}
		if _, err := respDo(addr, time.Second, "PING"); err == nil {
			t.Fatal("PING after Kill succeeded")
		}
		if err := r.Kill(); err != nil {
			t.Errorf("second Kill: %v", err)
		}
		if err := r.Restart(); err != nil {
			t.Fatal(err)
		}
		if r.Addr() != addr {
			t.Errorf("Addr after Restart = %s, want %s", r.Addr(), addr)
		}
		if got := mustDo(t, addr, "GET", k); got != nil {
			t.Errorf("GET after restart = %v, want nil (no persistence)", got)
		}
		// Restart while running kills first.
		pid := r.PID()
		if err := r.Restart(); err != nil {
			t.Fatal(err)
		}
		if r.PID() == pid || processAlive(pid) {
			t.Errorf("Restart of a running server kept pid %d alive", pid)
		}
	})
	t.Run("PauseResume", func(t *testing.T) {
		checkPaused(t, r, "PING", true, func() error {
			_, err := respDo(r.Addr(), 300*time.Millisecond, "PING")
			return err
		})
		if got := mustDo(t, r.Addr(), "PING"); got != "PONG" {
			t.Fatalf("PING after Resume = %v, want PONG", got)
		}
	})
}

func TestRedisPersistence(t *testing.T) {
	t.Parallel()
	r := redisDurable
	k := locktest.Key(t)
	mustDo(t, r.Addr(), "SET", k, "kept")
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := mustDo(t, r.Addr(), "GET", k); got != "kept" {
		t.Fatalf("GET after Kill+Restart = %v, want kept", got)
	}
}

func TestRedisStop(t *testing.T) {
	t.Parallel()
	r, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Pause(); err != nil {
		t.Fatal(err)
	}
	if d := checkStop(t, r, r.PID(), r.Dir()); d >= testserver.StopGrace {
		t.Errorf("Stop of a paused server took %v, want a graceful stop under %v", d, testserver.StopGrace)
	}
	if err := r.Restart(); err == nil {
		t.Error("Restart after Stop succeeded, want an error")
	}
	if err := r.Pause(); err == nil {
		t.Error("Pause after Stop succeeded, want an error")
	}
	var nilRedis *testserver.Redis
	if err := nilRedis.Stop(); err != nil {
		t.Errorf("nil Stop = %v", err)
	}
}

func TestRedisFixedPort(t *testing.T) {
	t.Parallel()
	r, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	port := r.Port()
	// The port is taken: a second server on it must fail, not retry elsewhere.
	_, err = testserver.StartRedis(testserver.RedisOptions{Port: port, StartTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("StartRedis on a taken port: err = %v, want one mentioning the port in use", err)
	}
}

func TestStartRedisN(t *testing.T) {
	t.Parallel()
	nodes, err := testserver.StartRedisN(3, testserver.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := testserver.StopAll(nodes...); err != nil {
			t.Error(err)
		}
	}()
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n.Addr()] {
			t.Errorf("duplicate addr %s", n.Addr())
		}
		seen[n.Addr()] = true
		if got := mustDo(t, n.Addr(), "PING"); got != "PONG" {
			t.Errorf("%s PING = %v", n.Addr(), got)
		}
		info := mustDo(t, n.Addr(), "INFO", "replication").(string)
		if !strings.Contains(info, "role:master") || !strings.Contains(info, "connected_slaves:0") {
			t.Errorf("%s is not an independent primary:\n%s", n.Addr(), info)
		}
	}
}

func TestSentinel(t *testing.T) {
	t.Parallel()
	s := sentinel
	if s.MasterName() != "mymaster" {
		t.Errorf("MasterName = %q, want mymaster", s.MasterName())
	}
	if got := len(s.SentinelAddrs()); got != 3 {
		t.Fatalf("%d sentinels, want 3", got)
	}
	for _, addr := range s.SentinelAddrs() {
		got := mustDo(t, addr, "SENTINEL", "get-master-addr-by-name", "mymaster")
		want := []any{"127.0.0.1", strconv.Itoa(s.Primary().Port())}
		if !slices.Equal(got.([]any), want) {
			t.Errorf("%s: get-master-addr-by-name = %v, want %v", addr, got, want)
		}
	}
	info := mustDo(t, s.Replica().Addr(), "INFO", "replication").(string)
	if !strings.Contains(info, "master_link_status:up") {
		t.Errorf("replica not linked:\n%s", info)
	}
	if got, err := s.MasterAddr(context.Background()); err != nil || got != s.Primary().Addr() {
		t.Errorf("MasterAddr = %s, %v; want %s", got, err, s.Primary().Addr())
	}
}

// TestSentinelFailover uses its own deployment: it leaves it failed over.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s, err := testserver.StartSentinel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	}()
	// Kill the primary: the sentinels must promote the replica.
	t0 := time.Now()
	if err := s.Primary().Kill(); err != nil {
		t.Fatal(err)
	}
	within(t, 20*time.Second, "failover to the replica", func() error {
		got, err := s.MasterAddr(context.Background())
		if err != nil {
			return err
		}
		if got != s.Replica().Addr() {
			return fmt.Errorf("master is %s, want %s", got, s.Replica().Addr())
		}
		return nil
	})
	t.Logf("failover took %v", time.Since(t0).Round(time.Millisecond))
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := cluster
	if got := len(c.Addrs()); got != 3 {
		t.Fatalf("%d nodes, want 3", got)
	}
	for _, addr := range c.Addrs() {
		info := mustDo(t, addr, "CLUSTER", "INFO").(string)
		if !strings.Contains(info, "cluster_state:ok") {
			t.Errorf("%s: CLUSTER INFO:\n%s", addr, info)
		}
		slots := mustDo(t, addr, "CLUSTER", "SLOTS").([]any)
		if len(slots) != 3 {
			t.Errorf("%s: CLUSTER SLOTS has %d ranges, want 3", addr, len(slots))
		}
	}
	// A key is served by the node owning its slot: "foo" is slot 12182.
	v, err := respDo(c.Nodes()[0].Addr(), time.Second, "SET", "foo", "bar")
	if err == nil || !strings.HasPrefix(err.Error(), "MOVED 12182 ") {
		t.Errorf("SET foo on node 0 = %v, %v; want MOVED 12182", v, err)
	}
	if got := mustDo(t, c.Nodes()[2].Addr(), "SET", "foo", "bar"); got != "OK" {
		t.Errorf("SET foo on node 2 = %v, want OK", got)
	}
}

// ---------------------------------------------------------------------------
// etcd

func TestEtcd(t *testing.T) {
	t.Parallel()
	e := etcd
	if err := etcdHealth(t, e); err != nil {
		t.Fatal(err)
	}
	if got := e.ClientURL(); got != "http://"+e.Endpoints()[0] {
		t.Errorf("ClientURL = %s, want http:// + %s", got, e.Endpoints()[0])
	}

	// Data survives Kill + Restart (etcd always persists).
	key := base64.StdEncoding.EncodeToString([]byte(locktest.Key(t)))
	val := base64.StdEncoding.EncodeToString([]byte("v"))
	var put map[string]any
	if err := etcdJSON(t, "POST", e.ClientURL()+"/v3/kv/put", `{"key":"`+key+`","value":"`+val+`"}`, &put); err != nil {
		t.Fatal(err)
	}
	if err := e.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := etcdHealth(t, e); err == nil {
		t.Fatal("healthy after Kill")
	}
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	var rng struct {
		Kvs []struct{ Value string } `json:"kvs"`
	}
	if err := etcdJSON(t, "POST", e.ClientURL()+"/v3/kv/range", `{"key":"`+key+`"}`, &rng); err != nil {
		t.Fatal(err)
	}
	if len(rng.Kvs) != 1 || rng.Kvs[0].Value != val {
		t.Errorf("range after restart = %+v, want value %s", rng.Kvs, val)
	}

	checkPaused(t, e, "health check", false, func() error { return etcdHealth(t, e) })
	within(t, 5*time.Second, "healthy after Resume", func() error { return etcdHealth(t, e) })
}

func TestEtcdCluster(t *testing.T) {
	t.Parallel()
	c := etcdCluster
	if got := len(c.Endpoints()); got != 3 {
		t.Fatalf("%d endpoints, want 3", got)
	}
	for _, m := range c.Members() {
		if err := etcdHealth(t, m); err != nil {
			t.Errorf("%s: %v", m.Name(), err)
		}
	}
	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(c.Members(), leader) {
		t.Fatalf("Leader() = %v, not a member", leader)
	}
	// Kill the leader: another member takes over; the old one rejoins.
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	next, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("Leader() after killing %s = the same member", leader.Name())
	}
	t.Logf("new leader %s after %v", next.Name(), time.Since(t0).Round(time.Millisecond))
	if err := leader.Restart(); err != nil {
		t.Fatal(err)
	}
}

// ---------------------------------------------------------------------------
// ZooKeeper

func TestZooKeeper(t *testing.T) {
	t.Parallel()
	z := zk
	if got, err := zkFourLetter(z.Addr(), "ruok"); err != nil || got != "imok" {
		t.Fatalf("ruok = %q, %v; want imok", got, err)
	}
	// tickTime 500 ms: a 2 s session is granted as asked, 60 s is clamped to 10 s.
	if got, err := zkSession(z.Addr(), 2*time.Second); err != nil || got != 2*time.Second {
		t.Errorf("session timeout for 2s = %v, %v; want 2s", got, err)
	}
	if got, err := zkSession(z.Addr(), time.Minute); err != nil || got != 10*time.Second {
		t.Errorf("session timeout for 60s = %v, %v; want 10s", got, err)
	}

	checkPaused(t, z, "ruok", false, func() error {
		_, err := zkFourLetter(z.Addr(), "ruok")
		return err
	})
	within(t, 5*time.Second, "ruok after Resume", func() error {
		got, err := zkFourLetter(z.Addr(), "ruok")
		if err == nil && got != "imok" {
			err = fmt.Errorf("ruok = %q", got)
		}
		return err
	})

	addr, pid := z.Addr(), z.PID()
	if err := z.Kill(); err != nil {
		t.Fatal(err)
	}
	if processAlive(pid) {
		t.Fatalf("JVM %d alive after Kill", pid)
	}
	t0 := time.Now()
	if err := z.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("ZooKeeper restart took %v", time.Since(t0).Round(time.Millisecond))
	if z.Addr() != addr {
		t.Errorf("Addr after Restart = %s, want %s", z.Addr(), addr)
	}
	if _, err := zkSession(z.Addr(), 2*time.Second); err != nil {
		t.Errorf("session after Restart: %v", err)
	}
}

// ---------------------------------------------------------------------------
// Errors and process lifetime

func TestMissingBinaries(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("JAVA_HOME", "")
	for _, c := range []struct {
		name  string
		start func() error
		want  string
	}{
		{"redis", func() error { _, err := testserver.StartRedis(testserver.RedisOptions{}); return err },
			"testserver: redis-server not found in PATH; install it with: apt-get install -y redis-server"},
		{"etcd", func() error { _, err := testserver.StartEtcd(testserver.EtcdOptions{}); return err },
			"testserver: etcd not found in PATH; install it with: apt-get install -y etcd-server"},
		{"zookeeper", func() error { _, err := testserver.StartZooKeeper(testserver.ZooKeeperOptions{}); return err },
			"install it with: apt-get install -y zookeeper"},
	} {
		err := c.start()
		if !errors.Is(err, testserver.ErrNotInstalled) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrNotInstalled containing %q", c.name, err, c.want)
		}
	}
}

func TestInvalidOptions(t *testing.T) {
	t.Parallel()
	for name, start := range map[string]func() error{
		"StartRedisN(0)":        func() error { _, err := testserver.StartRedisN(0, testserver.RedisOptions{}); return err },
		"StartRedisN shared":    func() error { _, err := testserver.StartRedisN(2, testserver.RedisOptions{Port: 7000}); return err },
		"Redis negative port":   func() error { _, err := testserver.StartRedis(testserver.RedisOptions{Port: -1}); return err },
		"Redis negative timout": func() error { _, err := testserver.StartRedis(testserver.RedisOptions{StartTimeout: -1}); return err },
		"StartEtcdCluster(0)":   func() error { _, err := testserver.StartEtcdCluster(0); return err },
		"ZooKeeper 1.5ms tick": func() error {
			_, err := testserver.StartZooKeeper(testserver.ZooKeeperOptions{TickTime: 1500 * time.Microsecond})
			return err
		},
	} {
		if err := start(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestServersDieWithParent runs this test binary as a helper that starts a
// redis-server, kills the helper with SIGKILL and checks that the server
// dies too (Pdeathsig).
func TestServersDieWithParent(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stderr = os.Stderr
	hold, err := cmd.StdinPipe() // the helper runs while this stays open
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper output: %v", err)
	}
	pidStr, dir, _ := strings.Cut(strings.TrimSpace(line), " ")
	if dir != "" {
		t.Cleanup(func() { os.RemoveAll(dir) }) // the killed helper cannot
	}
	pid, err := strconv.Atoi(pidStr)
	if err != nil || !processAlive(pid) {
		t.Fatalf("helper printed %q (%v), want the PID of a live redis-server", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	within(t, 5*time.Second, "redis-server dies with its parent", func() error {
		if processAlive(pid) {
			return fmt.Errorf("pid %d alive", pid)
		}
		return nil
	})
}

func helperMain() {
	r, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(2)
	}
	fmt.Println(r.PID(), r.Dir())
	// The point of this process is to be killed while it runs: it parks
	// until then, and exits 3 if its parent closes stdin instead.
	io.Copy(io.Discard, os.Stdin)
	r.Stop()
	os.Exit(3)
}
