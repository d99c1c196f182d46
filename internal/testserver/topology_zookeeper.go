package testserver

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ensembleStartTimeout bounds the start of a whole ensemble: three JVMs
// start at once and must elect a leader before any accepts a session.
const ensembleStartTimeout = 60 * time.Second

// ZooKeeperEnsemble is a ZooKeeper ensemble of servers on loopback, each a
// [ZooKeeper] with its own client, quorum and election ports, myid and
// data directory. Besides the standalone configuration, every server gets
// syncLimit=2 (a follower drops a leader it has not heard from for 2 ×
// tickTime, so a dead leader is replaced within a few ticks) and the
// server.N lines of all members.
//
// Its methods are safe for concurrent use.
type ZooKeeperEnsemble struct {
	servers []*ZooKeeper
}

// StartZooKeeperEnsemble starts n servers (3 for failure tests) with
// opts.TickTime (opts.Port must be 0) and returns once every one accepts a
// session, which needs an elected leader; the wait is bounded by
// opts.StartTimeout, or 60 s when it is 0. On error it stops what it
// started and returns nil.
func StartZooKeeperEnsemble(n int, opts ZooKeeperOptions) (*ZooKeeperEnsemble, error) {
	if n < 1 {
		return nil, fmt.Errorf("testserver: StartZooKeeperEnsemble: invalid n %d: must be positive", n)
	}
	return startEnsemble(n, opts, nil)
}

// startEnsemble starts n servers on loopback, or each in its namespace of
// lab when lab is not nil.
func startEnsemble(n int, opts ZooKeeperOptions, lab *netLab) (*ZooKeeperEnsemble, error) {
	if opts.Port != 0 {
		return nil, fmt.Errorf("testserver: StartZooKeeperEnsemble: Port %d cannot be shared by %d servers; use 0", opts.Port, n)
	}
	tick, err := tickTime(opts.TickTime)
	if err != nil {
		return nil, err
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = ensembleStartTimeout
	}
	if _, err := startTimeout(timeout); err != nil {
		return nil, err
	}
	java, jars, err := zooKeeperInstall()
	if err != nil {
		return nil, err
	}
	return retryBind(false, func() (*ZooKeeperEnsemble, error) {
		return tryStartEnsemble(n, java, jars, tick, timeout, lab)
	})
}

func tryStartEnsemble(n int, java string, jars []string, tick, timeout time.Duration, lab *netLab) (_ *ZooKeeperEnsemble, err error) {
	ps, err := pickPorts(3 * n)
	if err != nil {
		return nil, err
	}
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = "127.0.0.1"
		if lab != nil {
			hosts[i] = lab.IP(i)
		}
	}
	e := &ZooKeeperEnsemble{servers: make([]*ZooKeeper, n)}
	defer func() {
		if err != nil {
			_ = e.Stop()
		}
	}()
	var members []string
	for i := range n {
		members = append(members, fmt.Sprintf("server.%d=%s:%d:%d", i+1, hosts[i], ps[3*i+1], ps[3*i+2]))
	}
	for i := range e.servers {
		dir, err := os.MkdirTemp("", "dlock-testserver-zookeeper-")
		if err != nil {
			return nil, fmt.Errorf("testserver: %w", err)
		}
		z, err := newEnsembleServer(java, jars, dir, i+1, hosts[i], ps[3*i], ps[3*i+2], tick, timeout, members)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if lab != nil {
			// Run java in the namespace; its listeners are not visible
			// from here, so only the session handshake proves readiness.
			z.srv.args = append(append(lab.wrap(i), z.srv.bin), z.srv.args...)
			z.srv.bin = lab.ipBin
			z.srv.ports = nil
			z.srv.name += " in " + lab.ns(i)
		}
		e.servers[i] = z
	}
	if err := launchAll(e.servers, func(z *ZooKeeper) *server { return z.srv }); err != nil {
		return nil, err
	}
	return e, nil
}

// newEnsembleServer writes the configuration of ensemble member id into
// dir and returns it, not started.
func newEnsembleServer(java string, jars []string, dir string, id int, host string, port, electionPort int, tick, timeout time.Duration, members []string) (*ZooKeeper, error) {
	if err := writeZKLogConfig(dir); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, fmt.Errorf("testserver: %w", err)
	}
	if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(id)+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("testserver: %w", err)
	}
	cfg := fmt.Sprintf(`tickTime=%d
initLimit=10
syncLimit=2
dataDir=%s
clientPort=%d
clientPortAddress=%s
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,conf,cons,envi,wchs,isro
%s
`, tick/time.Millisecond, data, port, host, strings.Join(members, "\n"))
	cfgPath := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("testserver: %w", err)
	}
	classpath := strings.Join(append([]string{dir}, jars...), string(os.PathListSeparator))
	z := &ZooKeeper{host: host, port: port, tickTime: tick}
	addr := z.Addr()
	z.srv = &server{
		name:    fmt.Sprintf("zookeeper %s (server.%d)", addr, id),
		bin:     java,
		args:    zkArgs("192m", dir, classpath, cfgPath),
		dir:     dir,
		logPath: filepath.Join(dir, "zookeeper.log"),
		timeout: timeout,
		ready:   func() error { return zkHandshake(addr) },
		ports:   []int{port, electionPort},
	}
	return z, nil
}

// Servers returns the members, in the order of their ids 1, 2, ...
func (e *ZooKeeperEnsemble) Servers() []*ZooKeeper { return append([]*ZooKeeper(nil), e.servers...) }

// Addrs returns every member's client address ("127.0.0.1:PORT").
func (e *ZooKeeperEnsemble) Addrs() []string {
	return addrsOf(e.servers)
}

// Leader returns the index in Servers of the member whose "srvr" command
// reports "Mode: leader". Members that do not answer within a second are
// skipped; during an election it keeps asking for up to 5 s, then returns
// an error.
func (e *ZooKeeperEnsemble) Leader() (int, error) {
	leader := -1
	err := poll(leaderWait, func() error {
		var errs []error
		for i, z := range e.servers {
			mode, err := zkMode(z.Addr())
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if mode == "leader" {
				leader = i
				return nil
			}
		}
		return errors.Join(append([]error{errors.New("no member reports Mode: leader")}, errs...)...)
	})
	if err != nil {
		return -1, fmt.Errorf("testserver: zookeeper leader: %w", err)
	}
	return leader, nil
}

// zkMode sends the four-letter word srvr and returns the "Mode:" field
// ("leader", "follower", "standalone").
func zkMode(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte("srvr")); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(c, 1<<16))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Mode:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s: srvr: no Mode in %q", addr, b)
}

// Stop stops every member concurrently (see [ZooKeeper.Stop]) and removes
// their directories. It is idempotent and safe on a nil *ZooKeeperEnsemble.
func (e *ZooKeeperEnsemble) Stop() error {
	if e == nil {
		return nil
	}
	return StopAll(e.servers...)
}
