package testserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// clusterNodeTimeout is cluster-node-timeout for the nodes of StartCluster:
// how long a node may be unreachable before the others mark it failed.
const clusterNodeTimeout = 2 * time.Second

// Cluster is a Redis Cluster on loopback: three primaries, no replicas,
// slots 0-5460, 5461-10922 and 10923-16383 assigned in that order, each node
// with its own cluster bus port (cluster-port), cluster-node-timeout 2000 ms
// and no persistence (nodes.conf is kept, so a restarted node rejoins with
// its slots but without data).
//
// Its methods are safe for concurrent use.
type Cluster struct {
	nodes []*Redis
}

// StartCluster starts three cluster-enabled redis-servers, assigns the slots
// (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER MEET) and waits until every
// node reports cluster_state:ok, bounded by DefaultStartTimeout. On error it
// stops what it started and returns nil.
func StartCluster() (*Cluster, error) {
	c := &Cluster{nodes: make([]*Redis, 3)}
	return startedOrStopped(c, c.start())
}

func (c *Cluster) start() error {
	if err := startClusterNodes(c.nodes); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), DefaultStartTimeout)
	defer cancel()
	const slots = 16384
	for i, n := range c.nodes {
		lo, hi := i*slots/len(c.nodes), (i+1)*slots/len(c.nodes)-1
		if _, err := n.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			return fmt.Errorf("testserver: cluster: %s: CLUSTER ADDSLOTSRANGE %d %d: %w", n.Addr(), lo, hi, err)
		}
	}
	for _, n := range c.nodes[1:] {
		_, err := c.nodes[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(n.Port()), strconv.Itoa(n.busPort))
		if err != nil {
			return fmt.Errorf("testserver: cluster: CLUSTER MEET %s: %w", n.Addr(), err)
		}
	}
	if err := c.WaitOK(DefaultStartTimeout); err != nil {
		return err
	}
	return nil
}

// WaitOK waits until every node answers CLUSTER INFO with cluster_state:ok
// and knows all nodes, for example after restarting a node, and returns an
// error after timeout.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	err := poll(timeout, func() error {
		for _, n := range c.nodes {
			if err := clusterNodeOK(n, len(c.nodes)); err != nil {
				return fmt.Errorf("%s: %w", n.Addr(), err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testserver: cluster not ok after %v: %w", timeout, err)
	}
	return nil
}

func clusterNodeOK(n *Redis, size int) error {
	info, err := infoText(n, "CLUSTER", "INFO")
	if err != nil {
		return err
	}
	if st := infoField(info, "cluster_state"); st != "ok" {
		return fmt.Errorf("cluster_state is %q, want ok", st)
	}
	if k := infoField(info, "cluster_known_nodes"); k != strconv.Itoa(size) {
		return fmt.Errorf("cluster_known_nodes is %q, want %d", k, size)
	}
	return nil
}

// Addrs returns the nodes' addresses ("127.0.0.1:PORT"), as go-redis'
// ClusterOptions.Addrs wants them.
func (c *Cluster) Addrs() []string {
	return addrsOf(c.nodes)
}

// Nodes returns the three nodes, in slot order.
func (c *Cluster) Nodes() []*Redis { return append([]*Redis(nil), c.nodes...) }

// Stop stops all nodes concurrently (see [Redis.Stop]) and removes their
// directories. It is idempotent and safe on a nil *Cluster.
func (c *Cluster) Stop() error {
	if c == nil {
		return nil
	}
	return StopAll(c.nodes...)
}

// startClusterNodes starts a cluster-enabled redis-server for each slot of
// nodes, at once; nodes started are kept there even when another fails, so
// that the caller's Stop stops them.
func startClusterNodes(nodes []*Redis) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			nodes[i], errs[i] = startRedis(redisSpec{
				kind:    "cluster",
				busPort: true,
				timeout: DefaultStartTimeout,
				args: func(dir string, port, bus int) ([]string, error) {
					return append(redisBaseArgs(dir, port, false),
						"--cluster-enabled", "yes",
						"--cluster-config-file", "nodes.conf",
						"--cluster-port", strconv.Itoa(bus),
						"--cluster-node-timeout", strconv.Itoa(int(clusterNodeTimeout/time.Millisecond)),
					), nil
				},
			})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
