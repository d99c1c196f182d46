package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// NetRedis is a redis-server data node of a partitionable deployment: it
// runs in its own network namespace and listens on its namespace address
// (see the comment above ErrNoNetNS), port 6379. Restart waits until it
// answers PING; after a Kill it restarts empty.
//
// Its methods are safe for concurrent use.
type NetRedis struct {
	host string
	lifecycle
}

// netRedisPort is the port of every NetRedis: each namespace has its own.
const netRedisPort = 6379

// Addr returns the node's address, "10.213.S.N:6379".
func (r *NetRedis) Addr() string { return net.JoinHostPort(r.host, strconv.Itoa(netRedisPort)) }

// Stop ends the server and removes its directory. It is idempotent.
func (r *NetRedis) Stop() error { return r.srv.stop(true) }

// Do sends one command and returns its reply; ctx bounds the call.
func (r *NetRedis) Do(ctx context.Context, args ...string) (any, error) {
	return respDo(ctx, r.Addr(), args...)
}

// PartitionableSentinel is a Redis Sentinel deployment whose data nodes each
// run in their own network namespace, so the primary can be cut off from
// its replicas, from the sentinels and from every client: one primary, n
// replicas (asynchronous replication, no persistence) and three sentinels
// in the caller's namespace monitoring master "mymaster" with quorum 2,
// down-after-milliseconds 1000 and failover-timeout 3000, as
// [ReplicatedSentinel]. The sentinels and the clients reach the data nodes
// through the bridge at the addresses the sentinels announce.
//
// Its methods are safe for concurrent use.
type PartitionableSentinel struct {
	nodes      []*NetRedis // nodes[0] started as the primary
	sentinels  []*Redis
	partitions // of the data nodes: a cut node loses the sentinels too
}

// StartPartitionableSentinel starts the primary and replicas replicas, node
// i in its own namespace at 10.213.S.(i+2):6379, waits until every replica
// is in sync, then starts three sentinels on loopback and waits until each
// knows every replica and enough sentinels to authorize a failover. It
// fails with an error matching ErrNoNetNS where namespaces cannot be
// created. On error it stops what it started, removes the namespaces and
// returns nil.
func StartPartitionableSentinel(replicas int) (*PartitionableSentinel, error) {
	if replicas < 1 {
		return nil, fmt.Errorf("testserver: StartPartitionableSentinel: invalid replicas %d: want at least 1", replicas)
	}
	bin, err := lookPath("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	lab, err := newNetLab(replicas + 1)
	if err != nil {
		return nil, err
	}
	s := &PartitionableSentinel{partitions: partitions{lab}}
	return startedOrStopped(s, s.start(bin))
}

func (s *PartitionableSentinel) start(bin string) error {
	for i := range s.lab.n {
		n, err := s.newNode(bin, i)
		if err != nil {
			return err
		}
		s.nodes = append(s.nodes, n)
	}
	if err := launchAll(s.nodes, func(n *NetRedis) *server { return n.srv }); err != nil {
		return err
	}
	primary := s.nodes[0]
	for _, r := range s.nodes[1:] {
		if err := poll(DefaultStartTimeout, func() error { return linkUp(r) }); err != nil {
			return fmt.Errorf("testserver: sentinel: replica %s did not sync with %s: %w", r.Addr(), primary.Addr(), err)
		}
	}
	var err error
	s.sentinels, err = startSentinels(primary.host, netRedisPort, func(sn *Redis) error { return knowsReplicas(sn, len(s.nodes)-1) })
	return err
}

// newNode describes data node i (a replica of node 0 unless i is 0)
// without starting it.
func (s *PartitionableSentinel) newNode(bin string, i int) (*NetRedis, error) {
	dir, err := os.MkdirTemp("", "dlock-testserver-netredis-")
	if err != nil {
		return nil, fmt.Errorf("testserver: %w", err)
	}
	n := &NetRedis{host: s.lab.IP(i)}
	args := []string{
		"--port", strconv.Itoa(netRedisPort),
		"--bind", n.host,
		"--protected-mode", "no",
		"--dir", dir,
		"--daemonize", "no",
		"--logfile", "",
		"--save", "",
		"--appendonly", "no",
		"--repl-diskless-sync-delay", "0",
	}
	if i > 0 {
		args = append(args, "--replicaof", s.lab.IP(0), strconv.Itoa(netRedisPort))
	}
	addr := n.Addr()
	n.srv = &server{
		name:    "redis-server " + addr + " in " + s.lab.ns(i),
		bin:     s.lab.ipBin,
		args:    append(append(s.lab.wrap(i), bin), args...),
		dir:     dir,
		logPath: filepath.Join(dir, "redis.log"),
		timeout: DefaultStartTimeout,
		ready:   func() error { return respPing(addr) },
		// No ports: the listener lives in another namespace (see
		// startEtcdIn).
	}
	return n, nil
}

// startSentinelFor starts a sentinel on loopback monitoring the primary at
// host:port. It announces itself as 127.0.0.1: the other sentinels would
// otherwise learn the bridge address it reaches the primary from, on which
// it does not listen.
func startSentinelFor(host string, port int) (*Redis, error) {
	return startRedis(redisSpec{
		kind:    "sentinel",
		timeout: DefaultStartTimeout,
		args: func(dir string, sport, _ int) ([]string, error) {
			// Sentinel rewrites its config file, so it lives in dir and is
			// reused (with the sentinel's state) by Restart.
			conf := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %q
daemonize no
logfile ""
sentinel announce-ip 127.0.0.1
sentinel monitor %s %s %d 2
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 3000
sentinel parallel-syncs %s 1
`, sport, dir, SentinelMasterName, host, port,
				SentinelMasterName, SentinelMasterName, SentinelMasterName)
			path := filepath.Join(dir, "sentinel.conf")
			if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
				return nil, fmt.Errorf("testserver: %w", err)
			}
			return []string{path, "--sentinel"}, nil
		},
	})
}

// MasterName returns the monitored master name, "mymaster".
func (s *PartitionableSentinel) MasterName() string { return SentinelMasterName }

// SentinelAddrs returns the sentinels' addresses ("127.0.0.1:PORT").
func (s *PartitionableSentinel) SentinelAddrs() []string {
	return addrsOf(s.sentinels)
}

// Nodes returns the data nodes, the one started as the primary first.
func (s *PartitionableSentinel) Nodes() []*NetRedis { return append([]*NetRedis(nil), s.nodes...) }

// Primary asks the sentinels for the current primary and returns its index
// in Nodes. ctx bounds the call. During a failover the sentinels may still
// name the old primary.
func (s *PartitionableSentinel) Primary(ctx context.Context) (int, error) {
	return primaryIndex(ctx, s.sentinels, s.nodes)
}

// Stop stops every process concurrently, removes their directories, the
// namespaces and the bridge. It is idempotent and safe on a nil receiver.
func (s *PartitionableSentinel) Stop() error {
	if s == nil {
		return nil
	}
	errs := make([]error, len(s.nodes)+1)
	var wg sync.WaitGroup
	for i, n := range s.nodes {
		wg.Go(func() {
			errs[i] = n.Stop()
		})
	}
	wg.Wait()
	errs[len(s.nodes)] = StopAll(s.sentinels...)
	return errors.Join(append(errs, s.lab.close())...)
}
