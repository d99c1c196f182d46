package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// ReplicatedCluster is a Redis Cluster with replicas on loopback: a number
// of primaries, each with the same number of replicas, configured like
// [Cluster] (cluster-node-timeout 2000 ms, no persistence, nodes.conf kept
// so a restarted node rejoins with its role and slots but without data).
// When a primary stops answering for the node timeout, the others mark it
// failed and one of its replicas takes its slots over.
//
// Its methods are safe for concurrent use.
type ReplicatedCluster struct {
	nodes     []*Redis // primaries first, then the replicas of each in turn
	primaries int
}

// StartReplicatedCluster starts primaries × (1 + replicas) cluster-enabled
// redis-servers, assigns the slots evenly to the primaries, joins all
// nodes, makes replicas replicas of each primary (CLUSTER REPLICATE) and
// waits until every node reports cluster_state:ok and knows every node, and
// every replica's link to its primary is up, bounded by DefaultStartTimeout
// per step. On error it stops what it started and returns nil.
func StartReplicatedCluster(primaries, replicas int) (*ReplicatedCluster, error) {
	if primaries < 1 || replicas < 1 {
		return nil, fmt.Errorf("testserver: StartReplicatedCluster: invalid %d primaries × %d replicas: want at least 1 × 1", primaries, replicas)
	}
	c := &ReplicatedCluster{nodes: make([]*Redis, primaries*(1+replicas)), primaries: primaries}
	return startedOrStopped(c, c.start())
}

func (c *ReplicatedCluster) start() error {
	if err := startClusterNodes(c.nodes); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*DefaultStartTimeout)
	defer cancel()
	const slots = 16384
	ids := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		v, err := n.Do(ctx, "CLUSTER", "MYID")
		if err != nil {
			return fmt.Errorf("testserver: cluster: %s: CLUSTER MYID: %w", n.Addr(), err)
		}
		ids[i], _ = v.(string)
		if i < c.primaries {
			lo, hi := i*slots/c.primaries, (i+1)*slots/c.primaries-1
			if _, err := n.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
				return fmt.Errorf("testserver: cluster: %s: CLUSTER ADDSLOTSRANGE %d %d: %w", n.Addr(), lo, hi, err)
			}
		}
	}
	for _, n := range c.nodes[1:] {
		if _, err := c.nodes[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(n.Port()), strconv.Itoa(n.busPort)); err != nil {
			return fmt.Errorf("testserver: cluster: CLUSTER MEET %s: %w", n.Addr(), err)
		}
	}
	// A node can replicate a primary only once it knows it (gossip).
	for i, n := range c.nodes[c.primaries:] {
		primary := ids[i%c.primaries]
		err := poll(DefaultStartTimeout, func() error {
			_, err := n.Do(ctx, "CLUSTER", "REPLICATE", primary)
			return err
		})
		if err != nil {
			return fmt.Errorf("testserver: cluster: %s: CLUSTER REPLICATE %s: %w", n.Addr(), primary, err)
		}
	}
	err := poll(DefaultStartTimeout, func() error {
		for i, n := range c.nodes {
			if err := clusterNodeOK(n, len(c.nodes)); err != nil {
				return fmt.Errorf("%s: %w", n.Addr(), err)
			}
			if i >= c.primaries {
				if err := linkUp(n); err != nil {
					return fmt.Errorf("%s: %w", n.Addr(), err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testserver: replicated cluster not ok: %w", err)
	}
	return nil
}

// Addrs returns every node's address ("127.0.0.1:PORT"), as go-redis'
// ClusterOptions.Addrs wants them.
func (c *ReplicatedCluster) Addrs() []string {
	return addrsOf(c.nodes)
}

// Nodes returns every node: the primaries as started first, then their
// replicas. After a failover the roles differ: ask
// [ReplicatedCluster.PrimaryFor].
func (c *ReplicatedCluster) Nodes() []*Redis { return append([]*Redis(nil), c.nodes...) }

// PrimaryFor returns the index in Nodes of the primary that serves key's
// slot, as the first node that answers CLUSTER KEYSLOT and CLUSTER SLOTS
// sees it (during a failover, views may differ). ctx bounds the call.
func (c *ReplicatedCluster) PrimaryFor(ctx context.Context, key string) (int, error) {
	var errs []error
	for _, n := range c.nodes {
		i, err := c.primaryFor(ctx, n, key)
		if err == nil {
			return i, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.Addr(), err))
		if ctx.Err() != nil {
			break
		}
	}
	return -1, fmt.Errorf("testserver: primary for %q: %w", key, errors.Join(errs...))
}

func (c *ReplicatedCluster) primaryFor(ctx context.Context, n *Redis, key string) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	v, err := n.Do(cctx, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		return -1, err
	}
	slot, _ := v.(int64)
	v, err = n.Do(cctx, "CLUSTER", "SLOTS")
	if err != nil {
		return -1, err
	}
	ranges, _ := v.([]any)
	for _, r := range ranges {
		e, _ := r.([]any)
		if len(e) < 3 {
			continue
		}
		lo, _ := e[0].(int64)
		hi, _ := e[1].(int64)
		if slot < lo || slot > hi {
			continue
		}
		hp, _ := e[2].([]any)
		if len(hp) < 2 {
			break
		}
		host, _ := hp[0].(string)
		port, _ := hp[1].(int64)
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		for i, m := range c.nodes {
			if m.Addr() == addr {
				return i, nil
			}
		}
		return -1, fmt.Errorf("slot %d is served by %s, not a node", slot, addr)
	}
	return -1, fmt.Errorf("slot %d is not served", slot)
}

// Stop stops every node concurrently (see [Redis.Stop]) and removes their
// directories. It is idempotent and safe on a nil *ReplicatedCluster.
func (c *ReplicatedCluster) Stop() error {
	if c == nil {
		return nil
	}
	return StopAll(c.nodes...)
}
