package testserver

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// ReplicatedSentinel is a Redis Sentinel deployment with several replicas
// on loopback: one primary, n replicas and three sentinels monitoring
// master "mymaster" with quorum 2, down-after-milliseconds 1000 and
// failover-timeout 3000 (the same sentinel configuration as [Sentinel]).
// Data nodes run without persistence, so a killed node that is restarted
// comes back empty, as a primary of its own until a sentinel turns it into a
// replica of the current primary.
//
// Its methods are safe for concurrent use.
type ReplicatedSentinel struct {
	nodes     []*Redis // nodes[0] started as the primary
	sentinels []*Redis
}

// StartReplicatedSentinel starts the primary, then replicas replicas of it,
// waits until every replica is in sync, then starts three sentinels and
// waits until each knows every replica and enough sentinels to authorize a
// failover (SENTINEL CKQUORUM). Each wait is bounded by DefaultStartTimeout.
// On error it stops what it started and returns nil.
func StartReplicatedSentinel(replicas int) (*ReplicatedSentinel, error) {
	if replicas < 1 {
		return nil, fmt.Errorf("testserver: StartReplicatedSentinel: invalid replicas %d: want at least 1", replicas)
	}
	s := &ReplicatedSentinel{}
	return startedOrStopped(s, s.start(replicas))
}

func (s *ReplicatedSentinel) start(replicas int) error {
	primary, err := StartRedis(RedisOptions{})
	if err != nil {
		return err
	}
	s.nodes = append(s.nodes, primary)
	reps, err := StartRedisN(replicas, RedisOptions{Args: []string{
		"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()),
	}})
	if err != nil {
		return err
	}
	s.nodes = append(s.nodes, reps...)
	for _, r := range reps {
		if err := poll(DefaultStartTimeout, func() error { return linkUp(r) }); err != nil {
			return fmt.Errorf("testserver: sentinel: replica %s did not sync with %s: %w", r.Addr(), primary.Addr(), err)
		}
	}
	s.sentinels, err = startSentinels("127.0.0.1", primary.Port(), func(sn *Redis) error { return knowsReplicas(sn, replicas) })
	return err
}

// linkUp reports whether replica r's link to its primary is up.
func linkUp(r respDoer) error {
	info, err := infoText(r, "INFO", "replication")
	if err != nil {
		return err
	}
	if st := infoField(info, "master_link_status"); st != "up" {
		return fmt.Errorf("master_link_status is %q, want up", st)
	}
	return nil
}

// knowsReplicas reports whether sentinel sn can authorize a failover and
// knows at least n replicas.
func knowsReplicas(sn *Redis, n int) error {
	if err := sentinelSettled(sn); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := sn.Do(ctx, "SENTINEL", "REPLICAS", SentinelMasterName)
	if err != nil {
		return err
	}
	if reps, _ := v.([]any); len(reps) < n {
		return fmt.Errorf("sentinel knows %d replicas, want %d", len(reps), n)
	}
	return nil
}

// MasterName returns the monitored master name, "mymaster".
func (s *ReplicatedSentinel) MasterName() string { return SentinelMasterName }

// SentinelAddrs returns the sentinels' addresses ("127.0.0.1:PORT"), as
// go-redis' FailoverOptions.SentinelAddrs wants them.
func (s *ReplicatedSentinel) SentinelAddrs() []string {
	return addrsOf(s.sentinels)
}

// Nodes returns the data nodes, the one started as the primary first. After
// a failover the primary is another one: ask [ReplicatedSentinel.Primary].
func (s *ReplicatedSentinel) Nodes() []*Redis { return append([]*Redis(nil), s.nodes...) }

// Sentinels returns the three sentinel processes.
func (s *ReplicatedSentinel) Sentinels() []*Redis { return append([]*Redis(nil), s.sentinels...) }

// Primary asks the sentinels for the current primary (SENTINEL
// get-master-addr-by-name, first answer wins) and returns its index in
// Nodes. ctx bounds the call. During a failover the sentinels may still
// name the old primary.
func (s *ReplicatedSentinel) Primary(ctx context.Context) (int, error) {
	return primaryIndex(ctx, s.sentinels, s.nodes)
}

// Stop stops every process concurrently (see [Redis.Stop]) and removes
// their directories. It is idempotent and safe on a nil *ReplicatedSentinel.
func (s *ReplicatedSentinel) Stop() error {
	if s == nil {
		return nil
	}
	return StopAll(append(append([]*Redis(nil), s.nodes...), s.sentinels...)...)
}
