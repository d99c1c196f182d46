package verify

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// Replicated deployments: a Redis Sentinel group, a Redis Cluster with
// replicas, an etcd cluster and a ZooKeeper ensemble, started for
// "redis+sentinel://local", "redis+cluster://local", "etcd://local?n=3" and
// "zk://local?n=3", and the faults on their leading node
// (FaultLeaderKill, FaultLeaderPause, FaultLeaderPartition; for the last
// the Sentinel group's data nodes, or every etcd or ZooKeeper member, run
// in network namespaces).

// sentinelMaster is the master name of a local Sentinel group; the
// workers' URL names it as its path.
const sentinelMaster = testserver.SentinelMasterName

// localNodes is the default node count per local scheme that takes "?n=".
var localNodes = map[string]int{"redlock": 3, "etcd": 1, "zk": 1, "redis+sentinel": 3}

// replicated reports whether u names a local replicated deployment.
func replicated(u backendURL) bool {
	switch u.scheme {
	case "redis+sentinel", "redis+cluster":
		return true
	case "etcd", "zk":
		return u.nodes > 1
	}
	return false
}

// checkReplicatedFault rejects fault kinds a local deployment cannot take,
// and marks u to run in network namespaces for FaultLeaderPartition.
func checkReplicatedFault(u *backendURL, kind string) error {
	if kind == FaultLeaderPartition {
		if !u.local || !(u.scheme == "redis+sentinel" || (u.scheme == "etcd" || u.scheme == "zk") && u.nodes >= 3) {
			return invalid("fault %q needs a local Sentinel group, etcd cluster or ZooKeeper ensemble of at least 3: use redis+sentinel://local, etcd://local?n=3 or zk://local?n=3", kind)
		}
		if err := testserver.NetNSAvailable(); err != nil {
			return invalid("fault %q: %v", kind, err)
		}
		u.netns = true
	}
	switch {
	case (kind == FaultLeaderKill || kind == FaultLeaderPause) && u.scheme == "redlock":
		return invalid("fault %q: Redlock's nodes are independent and none leads; use %q or %q", kind, FaultRestart, FaultServerPause)
	case (kind == FaultLeaderKill || kind == FaultLeaderPause) && u.local && u.scheme == "postgres":
		return invalid("fault %q: a local PostgreSQL server is not replicated; use %q", kind, FaultRestart)
	case kind == FaultProxy && (u.scheme == "redis+sentinel" || u.scheme == "redis+cluster"):
		return invalid("fault %q: %s clients reach the data nodes at the addresses the deployment announces, not through a proxy", kind, u.scheme)
	case u.scheme == "redis+sentinel" && u.local && u.nodes < 2:
		return invalid("backend URL %q: a Sentinel group needs n ≥ 2 data nodes (a primary and a replica)", u.raw)
	}
	return nil
}

// startReplicated starts the replicated deployment u names.
func startReplicated(u backendURL, ttl time.Duration) (*lockServers, error) {
	s := &lockServers{}
	switch u.scheme {
	case "redis+sentinel":
		if u.netns {
			g, err := testserver.StartPartitionableSentinel(u.nodes - 1)
			if err != nil {
				return nil, fmt.Errorf("verify: start a Sentinel group in network namespaces: %w", err)
			}
			useSentinel(s, g.Nodes(), g.SentinelAddrs(), g.Primary, g.Stop)
			s.partition = cutter(g.Partition, g.Heal)
		} else {
			g, err := testserver.StartReplicatedSentinel(u.nodes - 1)
			if err != nil {
				return nil, fmt.Errorf("verify: start a Sentinel group: %w", err)
			}
			useSentinel(s, g.Nodes(), g.SentinelAddrs(), g.Primary, g.Stop)
		}
		// down-after-milliseconds 1000, then an election among the
		// sentinels and the promotion: about 2 s on loopback.
		s.failover = 3 * time.Second
	case "etcd":
		var c *testserver.EtcdCluster
		if u.netns {
			pc, err := testserver.StartPartitionableEtcdCluster(u.nodes)
			if err != nil {
				return nil, fmt.Errorf("verify: start an etcd cluster of %d in network namespaces: %w", u.nodes, err)
			}
			c, s.partition, s.stopAll = pc.EtcdCluster, cutter(pc.Partition, pc.Heal), pc.Stop
		} else {
			var err error
			if c, err = testserver.StartEtcdCluster(u.nodes); err != nil {
				return nil, fmt.Errorf("verify: start an etcd cluster of %d: %w", u.nodes, err)
			}
			s.stopAll = c.Stop
		}
		members := c.Members()
		for _, m := range members {
			s.nodes = append(s.nodes, m)
		}
		s.addrs = c.Endpoints()
		s.leader = func(context.Context, string) (int, error) {
			l, err := c.Leader()
			if err != nil {
				return -1, err
			}
			for i, m := range members {
				if m == l {
					return i, nil
				}
			}
			return -1, errors.New("verify: etcd leader is not a member")
		}
		s.failover = 2 * time.Second // election timeout 1 s, then one vote
	case "zk":
		opts := testserver.ZooKeeperOptions{TickTime: zkTick(ttl)}
		var e *testserver.ZooKeeperEnsemble
		if u.netns {
			pe, err := testserver.StartPartitionableZooKeeperEnsemble(u.nodes, opts)
			if err != nil {
				return nil, fmt.Errorf("verify: start a ZooKeeper ensemble of %d in network namespaces: %w", u.nodes, err)
			}
			e, s.partition, s.stopAll = pe.ZooKeeperEnsemble, cutter(pe.Partition, pe.Heal), pe.Stop
		} else {
			var err error
			if e, err = testserver.StartZooKeeperEnsemble(u.nodes, opts); err != nil {
				return nil, fmt.Errorf("verify: start a ZooKeeper ensemble of %d: %w", u.nodes, err)
			}
			s.stopAll = e.Stop
		}
		for _, z := range e.Servers() {
			s.nodes = append(s.nodes, z)
		}
		s.addrs = e.Addrs()
		s.leader = func(context.Context, string) (int, error) { return e.Leader() }
		// Followers drop a silent leader after syncLimit (2) ticks, then
		// elect one and sync with it.
		s.failover = 2*zkTick(ttl) + 2*time.Second
	case "redis+cluster":
		c, err := testserver.StartReplicatedCluster(3, 1)
		if err != nil {
			return nil, fmt.Errorf("verify: start a Redis Cluster of 3 × 2 nodes: %w", err)
		}
		for _, n := range c.Nodes() {
			s.nodes = append(s.nodes, n)
		}
		s.addrs = c.Addrs()
		s.leader = c.PrimaryFor
		s.stopAll = c.Stop
		// cluster-node-timeout 2 s, then the replica's election (0.5–1 s
		// delay, then the votes): 3–4.5 s measured on loopback.
		s.failover = 5 * time.Second
	default:
		return nil, invalid("cannot start a replicated %s deployment", u.scheme)
	}
	s.url = u.scheme + "://" + strings.Join(s.addrs, ",") + u.tail
	return s, nil
}

// useSentinel fills s for a Sentinel group: its data nodes, the sentinels'
// addresses (what the workers connect to), how to find the primary and how
// to stop every process.
func useSentinel[N interface {
	serverNode
	Addr() string
}](s *lockServers, nodes []N, sentinels []string, primary func(context.Context) (int, error), stop func() error) {
	for _, n := range nodes {
		s.nodes = append(s.nodes, n)
		s.nodeAddrs = append(s.nodeAddrs, n.Addr())
	}
	s.addrs = sentinels
	s.leader = func(ctx context.Context, _ string) (int, error) { return primary(ctx) }
	s.stopAll = stop
}

// cutter joins a Partition and a Heal method into lockServers.partition.
func cutter(partition, heal func(int) error) func(int, bool) error {
	return func(i int, cut bool) error {
		if cut {
			return partition(i)
		}
		return heal(i)
	}
}

// zkTick is the tickTime of a local ZooKeeper for lease TTL ttl: session
// timeouts are clamped to 2–20 × tickTime, so a TTL of at least 2 ticks
// stays possible.
func zkTick(ttl time.Duration) time.Duration {
	tick := min(testserver.DefaultTickTime, ttl/2).Truncate(time.Millisecond)
	return max(tick, 10*time.Millisecond)
}

// nodeAddr returns the address of node i, for messages.
func (s *lockServers) nodeAddr(i int) string {
	if len(s.nodeAddrs) > 0 {
		return s.nodeAddrs[i]
	}
	return s.addrs[i]
}

// leaderIndex returns the index of the node leading for key (on a Redis
// Cluster, the primary of key's slot); a deployment without a leader (one
// server) has only node 0.
func (s *lockServers) leaderIndex(ctx context.Context, key string) (int, error) {
	if s.leader == nil {
		return 0, nil
	}
	return s.leader(ctx, key)
}

// leaderFault kills (FaultLeaderKill), stops (FaultLeaderPause) or cuts
// off (FaultLeaderPartition) the leading node for p.length, or for the
// deployment's failover time when that is longer (a short TTL must not end
// the fault before a failover could begin), watching for another node to
// take over; then it restarts, continues or reconnects the node. The
// window's Detail says whether and when the deployment failed over.
func (r *run) leaderFault(ctx context.Context, p plan) error {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	idx, err := r.servers.leaderIndex(lctx, r.key)
	cancel()
	if err != nil {
		r.missed(p.kind, "no leading node: "+err.Error())
		return nil
	}
	n := r.servers.nodes[idx]
	addr := r.servers.nodeAddr(idx)
	length := max(p.length, r.servers.failover)
	h := r.currentHolder()
	start := time.Now()
	startNs := monoNow()
	var verb string
	switch p.kind {
	case FaultLeaderKill:
		verb, err = "SIGKILL", n.Kill()
	case FaultLeaderPause:
		verb, err = "SIGSTOP", n.Pause()
	default:
		verb, err = "cut off", r.servers.partition(idx, true)
	}
	if err != nil {
		return fmt.Errorf("verify: %s leading node %s: %w", verb, addr, err)
	}
	over := r.awaitFailover(ctx, idx, start.Add(length))
	sleep(ctx, time.Until(start.Add(length)))
	down := time.Since(start)
	switch p.kind {
	case FaultLeaderKill:
		err = n.Restart()
	case FaultLeaderPause:
		err = n.Resume()
	default:
		err = r.servers.partition(idx, false)
	}
	if err != nil {
		return fmt.Errorf("verify: bring back leading node %s: %w", addr, err)
	}
	persist := ""
	if p.kind == FaultLeaderKill {
		persist = ", restarted with its data"
		if strings.HasPrefix(r.cfg.url.scheme, "redis") {
			persist = ", restarted empty"
		}
	}
	r.window(Event{Op: p.kind, InvokeNs: startNs, Outcome: OutcomeOK, Target: "leader " + addr, Owner: h.owner, Fence: h.fence,
		Value: int64(down), Nodes: len(r.servers.nodes),
		Detail: fmt.Sprintf("%s for %v (%.2f × TTL)%s; %s", verb, down.Round(time.Millisecond), float64(down)/float64(r.cfg.TTL), persist, over)})
	return nil
}

// awaitFailover asks the deployment for its leading node until it names
// another one than old or until is reached, and describes the outcome.
func (r *run) awaitFailover(ctx context.Context, old int, until time.Time) string {
	if r.servers.leader == nil {
		return "no other node to fail over to"
	}
	start := time.Now()
	for time.Now().Before(until) && ctx.Err() == nil {
		lctx, cancel := context.WithDeadline(ctx, until)
		i, err := r.servers.leader(lctx, r.key)
		cancel()
		if err == nil && i != old {
			return fmt.Sprintf("%s took over after %v", r.servers.nodeAddr(i), time.Since(start).Round(time.Millisecond))
		}
		sleep(ctx, 100*time.Millisecond)
	}
	return "no other node took over within the window"
}
