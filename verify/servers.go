package verify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// serverNode is one lock server process the coordinator started.
type serverNode interface {
	Kill() error
	Restart() error
	Pause() error
	Resume() error
	Stop() error
}

// lockServers are the lock server(s) of a local backend URL.
type lockServers struct {
	nodes []serverNode
	addrs []string
	url   string // the URL workers use without the proxy
	// Replicated deployments only (replicated.go); nil or empty otherwise.
	nodeAddrs []string                                           // per node, when addrs name other processes (sentinels)
	leader    func(ctx context.Context, key string) (int, error) // index of the node leading for key
	stopAll   func() error                                       // stops every process, nodes or not
	failover  time.Duration                                      // a leader fault lasts at least this long
	partition func(i int, cut bool) error                        // cuts node i off (true) or heals it
}

// startServers starts the servers a local URL names.
func startServers(u backendURL, persist bool, ttl time.Duration) (*lockServers, error) {
	if replicated(u) {
		return startReplicated(u, ttl)
	}
	s := &lockServers{}
	switch u.scheme {
	case "redis":
		r, err := testserver.StartRedis(testserver.RedisOptions{Persistence: persist})
		if err != nil {
			return nil, fmt.Errorf("verify: start redis-server: %w", err)
		}
		s.nodes, s.addrs = []serverNode{r}, []string{r.Addr()}
	case "redlock":
		rs, err := testserver.StartRedisN(u.nodes, testserver.RedisOptions{Persistence: persist})
		if err != nil {
			return nil, fmt.Errorf("verify: start %d redis-servers: %w", u.nodes, err)
		}
		for _, r := range rs {
			s.nodes = append(s.nodes, r)
			s.addrs = append(s.addrs, r.Addr())
		}
	case "etcd":
		e, err := testserver.StartEtcd(testserver.EtcdOptions{})
		if err != nil {
			return nil, fmt.Errorf("verify: start etcd: %w", err)
		}
		s.nodes, s.addrs = []serverNode{e}, e.Endpoints()[:1]
	case "zk":
		// Session timeouts are clamped to 2–20 × tickTime: keep a TTL of
		// at least 2 ticks possible.
		tick := min(testserver.DefaultTickTime, ttl/2).Truncate(time.Millisecond)
		tick = max(tick, 10*time.Millisecond)
		z, err := testserver.StartZooKeeper(testserver.ZooKeeperOptions{TickTime: tick})
		if err != nil {
			return nil, fmt.Errorf("verify: start ZooKeeper: %w", err)
		}
		s.nodes, s.addrs = []serverNode{z}, []string{z.Addr()}
	case "postgres":
		return startPostgres(u)
	default:
		return nil, invalid("cannot start %s servers", u.scheme)
	}
	s.url = u.scheme + "://" + strings.Join(s.addrs, ",") + u.tail
	return s, nil
}

// stop stops every node.
func (s *lockServers) stop() error {
	if s == nil {
		return nil
	}
	if s.stopAll != nil {
		return s.stopAll()
	}
	var errs []error
	for _, n := range s.nodes {
		errs = append(errs, n.Stop())
	}
	return errors.Join(errs...)
}

// defaultPorts are the ports assumed for hosts given without one when a
// proxy must be put in front of them.
var defaultPorts = map[string]int{"redis": 6379, "rediss": 6379, "redlock": 6379, "etcd": 2379, "zk": 2181, "postgres": 5432}

// upstreams returns the host:port list of an external URL, for the proxy.
func upstreams(raw, scheme string) ([]string, error) {
	var out []string
	for _, h := range hostsOf(raw) {
		if _, _, err := net.SplitHostPort(h); err == nil {
			out = append(out, h)
			continue
		}
		p, ok := defaultPorts[scheme]
		if !ok {
			return nil, invalid("fault %q: cannot tell the port of host %q in %s; write HOST:PORT", FaultProxy, h, RedactURL(raw))
		}
		out = append(out, net.JoinHostPort(strings.Trim(h, "[]"), strconv.Itoa(p)))
	}
	return out, nil
}
