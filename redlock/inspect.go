package redlock

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// NodeInfo is one node's view of a lock, as returned by InspectNodes.
type NodeInfo struct {
	Node string     // the node's address (see Nodes)
	Info dlock.Info // the lock on that node; zero when Err is set
	Err  error      // why the node did not answer, or nil
}

// InspectNodes reads the lock key on every node concurrently (redislock's
// Inspect: nothing is changed; a non-reentrant lease's owner is reported
// as the lease's token, without the node token's fence suffix), each bounded by the node timeout
// (WithNodeTimeout, default 50ms), and returns one entry per node in the
// order of Nodes. A node that did not answer has Err set, as a
// *dlock.NodeError. The error is only for invalid input, a closed Backend
// or ctx ending.
func (b *Backend) InspectNodes(ctx context.Context, key string) ([]NodeInfo, error) {
	return b.inspectNodes(ctx, key, false)
}

func (b *Backend) inspectNodes(ctx context.Context, key string, del bool) ([]NodeInfo, error) {
	if err := b.checkKey(ctx, key); err != nil {
		return nil, err
	}
	timeout := b.cfg.timeout(0)
	deadline := time.Now().Add(timeout)
	ans, err := gather(ctx, b, b.all, fan{deadline: deadline, timeout: timeout},
		func(ctx context.Context, i int) (dlock.Info, error) {
			if del {
				return b.nodes[i].ForceRelease(ctx, key)
			}
			return b.nodes[i].Inspect(ctx, key)
		},
		func([]answer[dlock.Info], int) (bool, bool) { return false, false }, // everyone
		nil)
	if err != nil {
		return nil, err
	}
	errs := nodeErrors(b, b.all, ans, deadline, timeout, nil)
	out := make([]NodeInfo, len(b.nodes))
	for i, a := range ans {
		out[i].Node = b.names[i]
		if a.done && a.err == nil {
			out[i].Info = a.val
			// A non-reentrant lease holds the nodes under a node token
			// (see nodeToken): report the lease's token.
			if in := &out[i].Info; in.Held {
				in.Owner = strings.TrimSuffix(in.Owner, "~"+strconv.FormatUint(in.Fence, 36))
			}
		}
	}
	for _, e := range errs {
		ne := e.(*dlock.NodeError)
		out[slices.Index(b.names, ne.Node)].Err = ne
	}
	return out, nil
}

// Inspect implements dlock.Inspector: it reads the lock on every node
// (see InspectNodes) and merges the views. The lock is held when one owner
// holds it on a quorum of nodes; Info then has that owner, the fence most
// of its nodes report (the lease's) with the highest hold count among
// them, and as TTL the time until fewer than a quorum of them hold it
// (the quorum-th longest remaining TTL).
// Waiters is -1: waiters are not queued on the servers.
//
// When the nodes that did not answer could change the verdict (held or
// not), the merged Info of the nodes that did is returned together with an
// error joining a summary and one *dlock.NodeError per failed node.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	nodes, err := b.inspectNodes(ctx, key, false)
	if err != nil {
		return dlock.Info{}, fmt.Errorf("redlock: inspect %q: %w", key, err)
	}
	return b.merge("inspect", key, nodes)
}

// ForceRelease implements dlock.ForceReleaser: it deletes the lock on
// every node whoever holds it there (redislock's ForceRelease: release
// notifications are published and fences keep increasing), and returns the
// merged view of what it removed, as Inspect does. Locks held on a
// minority of nodes (an attempt under way, a split vote) are removed too.
// The error reports nodes that did not answer when they could have held a
// quorum.
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	nodes, err := b.inspectNodes(ctx, key, true)
	if err != nil {
		return dlock.Info{}, fmt.Errorf("redlock: force release %q: %w", key, err)
	}
	return b.merge("force release", key, nodes)
}

// merge combines the nodes' views of one lock.
func (b *Backend) merge(op, key string, nodes []NodeInfo) (dlock.Info, error) {
	type group struct {
		n      int
		fences map[uint64]int // fence → nodes
		counts map[uint64]int // fence → highest count
		ttls   []time.Duration
	}
	groups := make(map[string]*group)
	failed := 0
	var errs []error
	for _, n := range nodes {
		if n.Err != nil {
			failed++
			errs = append(errs, n.Err)
			continue
		}
		if !n.Info.Held {
			continue
		}
		g := groups[n.Info.Owner]
		if g == nil {
			g = &group{fences: make(map[uint64]int), counts: make(map[uint64]int)}
			groups[n.Info.Owner] = g
		}
		g.n++
		g.fences[n.Info.Fence]++
		g.counts[n.Info.Fence] = max(g.counts[n.Info.Fence], n.Info.Count)
		g.ttls = append(g.ttls, n.Info.TTL)
	}
	info := dlock.Info{Key: key, Waiters: -1}
	best, bestOwner := (*group)(nil), ""
	for owner, g := range groups {
		if best == nil || g.n > best.n || (g.n == best.n && owner > bestOwner) {
			best, bestOwner = g, owner
		}
	}
	most := 0
	if best != nil {
		most = best.n
	}
	if most >= b.quorum {
		// The fence most of the owner's nodes report: the lease's, written
		// back to a quorum (a node that joined later may report another).
		var fence uint64
		for f, n := range best.fences {
			if n > best.fences[fence] || n == best.fences[fence] && f > fence {
				fence = f
			}
		}
		info.Held, info.Owner, info.Fence, info.Count = true, bestOwner, fence, best.counts[fence]
		slices.Sort(best.ttls)
		slices.Reverse(best.ttls)
		info.TTL = best.ttls[b.quorum-1] // 0 when unknown
		return info, nil
	}
	if most+failed < b.quorum {
		return info, nil // whatever the silent nodes hold, no owner has a quorum
	}
	return info, joinErrs(
		fmt.Errorf("redlock: %s %q: %d of %d nodes did not answer; they could hold a quorum for an owner", op, key, failed, len(nodes)),
		errs)
}
