package testserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// EtcdOptions configures [StartEtcd]. The zero value is the default: a
// single member on free loopback ports. It has room for later options.
type EtcdOptions struct {
	// StartTimeout bounds the wait for GET /health to report true, at start
	// and at every Restart. 0 means DefaultStartTimeout (60 s).
	StartTimeout time.Duration
}

// Etcd is a running etcd 3.4 member listening on 127.0.0.1 (client and peer
// ports), with its data directory (data/) and log (etcd.log) in its own
// temporary directory. It runs with the zap logger and etcd's defaults
// otherwise (heartbeat 100 ms, election timeout 1000 ms).
//
// Restart waits until /health reports true. In a cluster that needs a
// quorum of members running, so restart members of a cluster that lost its
// quorum concurrently. A Kill keeps the data directory.
//
// Its methods are safe for concurrent use.
type Etcd struct {
	host       string // listen address; "" is 127.0.0.1 (see ip)
	name       string // member name
	clientPort int
	peerPort   int
	lifecycle
}

// etcdBootstrap returns the --initial-cluster flag's value for members
// ("name=peerURL,...") and a new cluster token.
func etcdBootstrap(members []*Etcd) (initial, token string) {
	names := make([]string, len(members))
	for i, m := range members {
		names[i] = m.name + "=" + m.peerURL()
	}
	return strings.Join(names, ","), fmt.Sprintf("testserver-%d-%d", os.Getpid(), clusterSeq.Add(1))
}

// etcdArgs returns the flags of member m of a new cluster (see
// etcdBootstrap), with its data under dir.
func etcdArgs(m *Etcd, dir, initial, token string) []string {
	url := m.ClientURL()
	return []string{
		"--name", m.name,
		"--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", url,
		"--advertise-client-urls", url,
		"--listen-peer-urls", m.peerURL(),
		"--initial-advertise-peer-urls", m.peerURL(),
		"--initial-cluster", initial,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", token,
		"--logger", "zap",
		"--log-outputs", "stderr",
	}
}

// clusterSeq makes every cluster token unique within this process, so a
// member can never join another test's cluster through a reused port.
var clusterSeq atomic.Int64

// StartEtcd starts a single-member etcd cluster and returns once GET /health
// on its client URL reports true. On failure it returns an error ending with
// the tail of the log and leaves nothing running or on disk. It fails with an
// error matching [ErrNotInstalled] if etcd is not in PATH.
func StartEtcd(opts EtcdOptions) (*Etcd, error) {
	c, err := startEtcdCluster(1, opts)
	if err != nil {
		return nil, err
	}
	return c.members[0], nil
}

// EtcdCluster is a static etcd cluster of members on loopback.
//
// Its methods are safe for concurrent use.
type EtcdCluster struct {
	members []*Etcd
}

// StartEtcdCluster starts n members (3 for failure tests) with a static
// --initial-cluster and returns once every member's /health reports true
// (which needs an elected leader), bounded by DefaultStartTimeout. On error
// it stops what it started and returns nil.
func StartEtcdCluster(n int) (*EtcdCluster, error) {
	if n <= 0 {
		return nil, fmt.Errorf("testserver: StartEtcdCluster: invalid n %d: must be positive", n)
	}
	return startEtcdCluster(n, EtcdOptions{})
}

func startEtcdCluster(n int, opts EtcdOptions) (*EtcdCluster, error) {
	timeout, err := startTimeout(opts.StartTimeout)
	if err != nil {
		return nil, err
	}
	bin, err := lookPath("etcd", "etcd-server")
	if err != nil {
		return nil, err
	}
	return retryBind(false, func() (*EtcdCluster, error) {
		return tryStartEtcdCluster(n, bin, timeout)
	})
}

func tryStartEtcdCluster(n int, bin string, timeout time.Duration) (_ *EtcdCluster, err error) {
	ps, err := pickPorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &EtcdCluster{members: make([]*Etcd, n)}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	for i := range c.members {
		c.members[i] = &Etcd{name: fmt.Sprintf("m%d", i), clientPort: ps[2*i], peerPort: ps[2*i+1]}
	}
	if err := c.prepare(bin, timeout, nil); err != nil {
		return nil, err
	}
	if err := launchAll(c.members, func(m *Etcd) *server { return m.srv }); err != nil {
		return nil, err
	}
	return c, nil
}

// prepare gives each member of c a new data directory and the server that
// runs etcd (bin) for it as a member of a new cluster (etcdBootstrap);
// adapt, if not nil, then adjusts member i's server s.
func (c *EtcdCluster) prepare(bin string, timeout time.Duration, adapt func(i int, s *server)) error {
	initial, token := etcdBootstrap(c.members)
	env := filterEnv("ETCD_") // etcd reads ETCD_* variables as flags
	for i, m := range c.members {
		dir, err := os.MkdirTemp("", "dlock-testserver-etcd-")
		if err != nil {
			return fmt.Errorf("testserver: %w", err)
		}
		url := m.ClientURL()
		m.srv = &server{
			name:    "etcd " + m.Endpoints()[0],
			bin:     bin,
			args:    etcdArgs(m, dir, initial, token),
			env:     env,
			dir:     dir,
			logPath: filepath.Join(dir, "etcd.log"),
			timeout: timeout,
			ready:   func() error { return etcdHealthy(url) },
			ports:   []int{m.clientPort, m.peerPort},
		}
		if adapt != nil {
			adapt(i, m.srv)
		}
	}
	return nil
}

// httpClient talks to etcd's HTTP endpoints. No keep-alives: an idle
// connection would leave transport goroutines behind for leak checkers. The
// transport goes on dialing after a request is cancelled, so the dial has its
// own bound: a connect to a partitioned member (SYNs dropped) would otherwise
// outlive the request by the kernel's connect timeout, minutes.
var httpClient = &http.Client{Transport: &http.Transport{
	DisableKeepAlives: true,
	DialContext:       (&net.Dialer{Timeout: 250 * time.Millisecond}).DialContext,
}}

// etcdHTTP does one request with a one-second timeout and returns the body of
// a 200 response.
func etcdHTTP(method, url, body string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

func etcdHealthy(clientURL string) error {
	b, err := etcdHTTP(http.MethodGet, clientURL+"/health", "")
	if err != nil {
		return err
	}
	var h struct {
		Health string `json:"health"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return fmt.Errorf("GET /health: %w (body %q)", err, b)
	}
	if h.Health != "true" {
		return fmt.Errorf("GET /health: %s", bytes.TrimSpace(b))
	}
	return nil
}

// Endpoints returns the member's client address as a one-element slice of
// "127.0.0.1:PORT", as clientv3.Config.Endpoints wants it.
func (e *Etcd) Endpoints() []string {
	return []string{net.JoinHostPort(e.ip(), strconv.Itoa(e.clientPort))}
}

// ClientURL returns the member's client URL, "http://127.0.0.1:PORT".
func (e *Etcd) ClientURL() string {
	return "http://" + net.JoinHostPort(e.ip(), strconv.Itoa(e.clientPort))
}

func (e *Etcd) peerURL() string {
	return "http://" + net.JoinHostPort(e.ip(), strconv.Itoa(e.peerPort))
}

// ip returns the member's listen address: 127.0.0.1, or its network
// namespace's address (topology_netns.go).
func (e *Etcd) ip() string {
	if e.host == "" {
		return "127.0.0.1"
	}
	return e.host
}

// Name returns the member name ("m0", "m1", ...).
func (e *Etcd) Name() string { return e.name }

// Stop sends SIGTERM, waits up to StopGrace (5 s), then sends SIGKILL, waits
// for the process to exit and removes Dir. A paused member is resumed so it
// can shut down. Stop is idempotent and safe on a nil *Etcd; after Stop the
// member cannot be restarted.
func (e *Etcd) Stop() error {
	if e == nil {
		return nil
	}
	return e.srv.stop(true)
}

// status is the part of POST /v3/maintenance/status we read; the gateway
// encodes uint64 as JSON strings.
type etcdStatus struct {
	Header struct {
		MemberID json.Number `json:"member_id"`
	} `json:"header"`
	Leader json.Number `json:"leader"`
}

func (e *Etcd) status() (etcdStatus, error) {
	var st etcdStatus
	b, err := etcdHTTP(http.MethodPost, e.ClientURL()+"/v3/maintenance/status", "{}")
	if err != nil {
		return st, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&st); err != nil {
		return st, fmt.Errorf("maintenance/status: %w (body %q)", err, b)
	}
	return st, nil
}

// Endpoints returns every member's client address ("127.0.0.1:PORT"), as
// clientv3.Config.Endpoints wants them.
func (c *EtcdCluster) Endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.Endpoints()...)
	}
	return eps
}

// Members returns the members, in the order of their names m0, m1, ...
func (c *EtcdCluster) Members() []*Etcd { return append([]*Etcd(nil), c.members...) }

// leaderWait bounds how long Leader waits for an elected leader.
const leaderWait = 5 * time.Second

// Leader returns the current leader: the member whose maintenance status
// (POST /v3/maintenance/status on the HTTP gateway) names itself as leader.
// Members that are down or paused are skipped (each is asked with a 1 s
// timeout, all at once). During an election it keeps asking for up to 5 s,
// then returns an error.
func (c *EtcdCluster) Leader() (*Etcd, error) {
	var leader *Etcd
	err := poll(leaderWait, func() error {
		sts := make([]etcdStatus, len(c.members))
		errs := make([]error, len(c.members))
		var wg sync.WaitGroup
		for i, m := range c.members {
			wg.Go(func() {
				sts[i], errs[i] = m.status()
			})
		}
		wg.Wait()
		for i, st := range sts {
			if errs[i] == nil && st.Leader != "" && st.Leader != "0" && st.Leader == st.Header.MemberID {
				leader = c.members[i]
				return nil
			}
		}
		return errors.Join(append([]error{errors.New("no member reports itself leader")}, errs...)...)
	})
	if err != nil {
		return nil, fmt.Errorf("testserver: etcd leader: %w", err)
	}
	return leader, nil
}

// Stop kills all members with SIGKILL, waits for them to exit and removes
// their directories. It does not stop them gracefully: a leader that gets
// SIGTERM tries to hand leadership to a follower first, and with every
// follower shutting down too that stalls until Etcd.Stop's SIGKILL after 5 s,
// while the data is thrown away anyway. It is idempotent and safe on a nil
// *EtcdCluster; stopped members cannot be restarted.
func (c *EtcdCluster) Stop() error {
	if c == nil {
		return nil
	}
	errs := make([]error, len(c.members))
	var wg sync.WaitGroup
	for i, m := range c.members {
		if m == nil {
			continue
		}
		wg.Go(func() {
			errs[i] = m.srv.stop(false)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
