package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// SentinelMasterName is the master name the sentinels of [StartSentinel]
// monitor.
const SentinelMasterName = "mymaster"

// Sentinel is a Redis Sentinel deployment on loopback: one primary, one
// replica and three sentinels (each its own redis-server --sentinel process
// with a generated sentinel.conf) monitoring master "mymaster" with quorum 2,
// down-after-milliseconds 1000 and failover-timeout 3000. Data nodes run
// without persistence.
//
// Its methods are safe for concurrent use.
type Sentinel struct {
	primary   *Redis
	replica   *Redis
	sentinels []*Redis
}

// StartSentinel starts the primary, then the replica, waits until the replica
// is in sync, then starts the three sentinels and waits until every sentinel
// knows the replica and the other sentinels (SENTINEL CKQUORUM succeeds), so
// a failover can start as soon as the primary fails. Each wait is bounded by
// DefaultStartTimeout. On error it stops what it started and returns nil.
func StartSentinel() (*Sentinel, error) {
	s := &Sentinel{}
	return startedOrStopped(s, s.start())
}

func (s *Sentinel) start() (err error) {
	if s.primary, err = StartRedis(RedisOptions{}); err != nil {
		return err
	}
	s.replica, err = StartRedis(RedisOptions{Args: []string{
		"--replicaof", "127.0.0.1", strconv.Itoa(s.primary.Port()),
	}})
	if err != nil {
		return err
	}
	if err := poll(DefaultStartTimeout, func() error { return linkUp(s.replica) }); err != nil {
		return fmt.Errorf("testserver: sentinel: replica %s did not sync with %s: %w",
			s.replica.Addr(), s.primary.Addr(), err)
	}
	s.sentinels, err = startSentinels("127.0.0.1", s.primary.Port(), sentinelSettled)
	return err
}

// startSentinels starts three sentinels monitoring the primary at
// host:port, concurrently, and waits until settled holds for each (bounded
// by DefaultStartTimeout each). It returns the sentinels it started, also
// on error, so that the caller can stop them.
func startSentinels(host string, port int, settled func(*Redis) error) ([]*Redis, error) {
	sentinels := make([]*Redis, 3)
	errs := make([]error, len(sentinels))
	var wg sync.WaitGroup
	for i := range sentinels {
		wg.Go(func() {
			sentinels[i], errs[i] = startSentinelFor(host, port)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return sentinels, err
	}
	for _, sn := range sentinels {
		if err := poll(DefaultStartTimeout, func() error { return settled(sn) }); err != nil {
			return sentinels, fmt.Errorf("testserver: sentinel %s did not settle: %w\n--- tail of %s ---\n%s",
				sn.Addr(), err, sn.LogFile(), readTail(sn.LogFile(), 0))
		}
	}
	return sentinels, nil
}

// sentinelSettled reports whether sn knows a replica and enough sentinels to
// authorize a failover.
func sentinelSettled(sn *Redis) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := sn.Do(ctx, "SENTINEL", "CKQUORUM", SentinelMasterName); err != nil {
		return err
	}
	v, err := sn.Do(ctx, "SENTINEL", "REPLICAS", SentinelMasterName)
	if err != nil {
		return err
	}
	if reps, _ := v.([]any); len(reps) == 0 {
		return errors.New("sentinel knows no replica yet")
	}
	return nil
}

// MasterName returns the monitored master name, "mymaster".
func (s *Sentinel) MasterName() string { return SentinelMasterName }

// SentinelAddrs returns the sentinels' addresses ("127.0.0.1:PORT"), as
// go-redis' FailoverOptions.SentinelAddrs wants them.
func (s *Sentinel) SentinelAddrs() []string {
	return addrsOf(s.sentinels)
}

// Sentinels returns the three sentinel processes (to kill or pause them).
func (s *Sentinel) Sentinels() []*Redis { return append([]*Redis(nil), s.sentinels...) }

// Primary returns the node that was started as the primary. After a failover
// it may be a replica (or dead); ask [Sentinel.MasterAddr] for the current
// primary.
func (s *Sentinel) Primary() *Redis { return s.primary }

// Replica returns the node that was started as the replica.
func (s *Sentinel) Replica() *Redis { return s.replica }

// MasterAddr asks the sentinels, in order, for the current primary's address
// (SENTINEL get-master-addr-by-name) and returns the first answer. ctx bounds
// the whole call.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	var errs []error
	for _, sn := range s.sentinels {
		v, err := sn.Do(ctx, "SENTINEL", "get-master-addr-by-name", SentinelMasterName)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hp, ok := v.([]any)
		if !ok || len(hp) != 2 {
			errs = append(errs, fmt.Errorf("sentinel %s replied %v", sn.Addr(), v))
			continue
		}
		host, _ := hp[0].(string)
		port, _ := hp[1].(string)
		return net.JoinHostPort(host, port), nil
	}
	return "", fmt.Errorf("testserver: no sentinel answered: %w", errors.Join(errs...))
}

// Stop stops all five processes concurrently (see [Redis.Stop]) and removes
// their directories. It is idempotent and safe on a nil *Sentinel.
func (s *Sentinel) Stop() error {
	if s == nil {
		return nil
	}
	return StopAll(append([]*Redis{s.primary, s.replica}, s.sentinels...)...)
}

// primaryIndex asks sentinels for the current primary (SENTINEL
// get-master-addr-by-name, first answer wins) and returns its index in
// nodes. ctx bounds the call.
func primaryIndex[N interface{ Addr() string }](ctx context.Context, sentinels []*Redis, nodes []N) (int, error) {
	addr, err := (&Sentinel{sentinels: sentinels}).MasterAddr(ctx)
	if err != nil {
		return -1, err
	}
	for i, n := range nodes {
		if n.Addr() == addr {
			return i, nil
		}
	}
	return -1, fmt.Errorf("testserver: sentinels name %s, which is not a data node", addr)
}
