package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// Part (e): the same contended workload on each backend. Workers, each
// with its own connection and Client (like separate processes), take one
// lock in a loop for a fixed time; each checks that nobody else is inside
// while it is (overlaps) and notes when the lock changed hands.
const (
	benchWorkers  = 4
	benchDuration = 2 * time.Second
	benchTTL      = 5 * time.Second // ≥ the etcd and ZooKeeper minimums
)

// backendRow is one backend's line in the table of part (e).
type backendRow struct {
	Backend        string  `json:"backend"`
	Workers        int     `json:"workers,omitempty"`
	Acquisitions   int64   `json:"acquisitions,omitempty"`
	Handoffs       int64   `json:"handoffs,omitempty"`
	HandoffsPerSec float64 `json:"handoffs_per_sec,omitempty"`
	Overlaps       int64   `json:"overlaps"`
	Errors         int64   `json:"errors"`
	Skipped        string  `json:"skipped,omitempty"`
}

// backendFactory opens one connection to a backend; closeFn closes what
// the Client does not (the user's client).
type backendFactory func(ctx context.Context) (b dlock.Backend, closeFn func(), err error)

func partBackends(ctx context.Context, env *demoEnv, r *partResult) {
	type entry struct {
		name string
		make backendFactory
		skip string
	}
	entries := []entry{
		{name: "memlock", make: memlockFactory()},
		{name: "redis", make: func(context.Context) (dlock.Backend, func(), error) {
			rdb := env.redisNode(env.redis.Addr(), 4)
			b, err := newRedisBackend(rdb)
			return b, func() { _ = rdb.Close() }, err
		}},
	}
	if len(env.redlock) > 0 {
		entries = append(entries, entry{name: "redlock (5 nodes)", make: func(context.Context) (dlock.Backend, func(), error) {
			nodes := env.redlockClients()
			b, err := newRedlockBackend(nodes, rlNodeTimeout)
			return b, func() { closeAll(nodes) }, err
		}})
	} else {
		entries = append(entries, entry{name: "redlock", skip: env.skip["redlock"]})
	}
	if env.etcd != nil {
		entries = append(entries, entry{name: "etcd", make: env.specFactory("etcd://" + strings.Join(env.etcd.Endpoints(), ","))})
	} else {
		entries = append(entries, entry{name: "etcd", skip: env.skip["etcd"]})
	}
	if env.zk != nil {
		entries = append(entries, entry{name: "zookeeper", make: env.specFactory("zk://" + env.zk.Addr())})
	} else {
		entries = append(entries, entry{name: "zookeeper", skip: env.skip["zookeeper"]})
	}

	var ran, skipped []string
	for _, e := range entries {
		if e.skip != "" {
			r.Rows = append(r.Rows, backendRow{Backend: e.name, Skipped: e.skip})
			skipped = append(skipped, e.name)
			continue
		}
		row, err := contend(ctx, env, e.name, e.make)
		r.Rows = append(r.Rows, row)
		ran = append(ran, fmt.Sprintf("%s %.0f/s", e.name, row.HandoffsPerSec))
		switch {
		case err != nil:
			r.fail("%s: %v", e.name, err)
		case row.Overlaps > 0:
			r.fail("%s: %d times two workers held the lock at once", e.name, row.Overlaps)
		case row.Acquisitions == 0:
			r.fail("%s: no acquisition in %v", e.name, benchDuration)
		case row.Handoffs == 0 && row.Acquisitions >= 10*benchWorkers:
			r.fail("%s: the lock never changed hands in %d acquisitions by %d workers", e.name, row.Acquisitions, benchWorkers)
		}
	}
	r.detail("%d workers per backend, each with its own connection, one lock, %v each, lease TTL %v:", benchWorkers, benchDuration, benchTTL)
	r.Summary = "hand-offs/s: " + strings.Join(ran, ", ")
	if len(skipped) > 0 {
		r.Summary += " (skipped: " + strings.Join(skipped, ", ") + ")"
	}
}

func memlockFactory() backendFactory {
	store := memlock.NewStore()
	return func(context.Context) (dlock.Backend, func(), error) {
		return store.Backend(), func() {}, nil
	}
}

// specFactory opens the backend of a URL the way --backend does.
func (e *demoEnv) specFactory(raw string) backendFactory {
	return func(ctx context.Context) (dlock.Backend, func(), error) {
		spec, err := parseBackendURL(raw)
		if err != nil {
			return nil, nil, err
		}
		c, err := openBackend(ctx, spec, e.g.timeout, benchTTL)
		if err != nil {
			return nil, nil, err
		}
		return c.backend, func() { _ = c.Close() }, nil
	}
}

// redlockClients returns one client per Redlock node.
func (e *demoEnv) redlockClients() []*redis.Client {
	nodes := make([]*redis.Client, len(e.redlock))
	for i, n := range e.redlock {
		nodes[i] = e.redisNode(n.Addr(), 4)
	}
	return nodes
}

func closeAll(nodes []*redis.Client) {
	for _, n := range nodes {
		_ = n.Close()
	}
}

// contend runs the workload of part (e) on one backend.
func contend(ctx context.Context, env *demoEnv, name string, open backendFactory) (backendRow, error) {
	row := backendRow{Backend: name, Workers: benchWorkers}
	clients := make([]*dlock.Client, benchWorkers)
	var closers []func()
	defer func() {
		for _, c := range clients {
			if c != nil {
				_ = c.Close()
			}
		}
		for _, f := range closers {
			f()
		}
	}()
	for i := range clients {
		b, closeFn, err := open(ctx)
		if closeFn != nil {
			closers = append(closers, closeFn)
		}
		if err != nil {
			return row, err
		}
		clients[i] = dlock.New(b, env.g.clientOptions(dlock.WithTTL(benchTTL))...)
	}
	key := "demo:e:" + strings.Fields(name)[0]
	var (
		inside, acquisitions, handoffs, overlaps, errCount atomic.Int64
		last                                               atomic.Int64
		firstErr                                           error
		errOnce                                            sync.Once
		wg                                                 sync.WaitGroup
	)
	deadline := time.Now().Add(benchDuration)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for i, c := range clients {
		me := int64(i + 1)
		wg.Go(func() {
			for dctx.Err() == nil {
				lease, err := c.Acquire(dctx, key)
				if err != nil {
					if dctx.Err() == nil {
						errCount.Add(1)
						errOnce.Do(func() { firstErr = err })
					}
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				acquisitions.Add(1)
				if prev := last.Swap(me); prev != 0 && prev != me {
					handoffs.Add(1)
				}
				inside.Add(-1)
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), env.g.timeout)
				err = lease.Release(rctx)
				rcancel()
				if err != nil {
					errCount.Add(1)
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	row.Acquisitions, row.Handoffs = acquisitions.Load(), handoffs.Load()
	row.Overlaps, row.Errors = overlaps.Load(), errCount.Load()
	row.HandoffsPerSec = float64(row.Handoffs) / benchDuration.Seconds()
	return row, firstErr
}

func printBackendTable(w io.Writer, rows []backendRow, indent string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%sbackend\tworkers\tacquisitions\thand-offs\thand-offs/s\toverlaps\n", indent)
	for _, r := range rows {
		if r.Skipped != "" {
			continue
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%d\t%d\t%.0f\t%d\n", indent, r.Backend, r.Workers, r.Acquisitions, r.Handoffs, r.HandoffsPerSec, r.Overlaps)
	}
	_ = tw.Flush()
	for _, r := range rows {
		if r.Skipped != "" {
			fmt.Fprintf(w, "%s%s: skipped: %s\n", indent, r.Backend, r.Skipped)
		}
	}
}
