//go:build linux

package testserver_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// A Sentinel deployment with two replicas starts, names its primary, and
// fails over to a replica once the primary is killed.
func TestReplicatedSentinelFailover(t *testing.T) {
	s, err := testserver.StartReplicatedSentinel(2)
	stopAtEnd(t, s, err)
	if got := len(s.Nodes()); got != 3 {
		t.Fatalf("got %d data nodes, want 3", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := s.Primary(ctx)
	if err != nil || p != 0 {
		t.Fatalf("Primary: got %d, %v, want 0, nil", p, err)
	}
	if err := s.Nodes()[0].Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		p, err = s.Primary(ctx)
		if err == nil && p != 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no failover: primary %d, %v", p, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if v, err := s.Nodes()[p].Do(ctx, "SET", "k", "v"); err != nil || v != "OK" {
		t.Errorf("SET on the new primary: got %v, %v, want OK", v, err)
	}
}

// A ZooKeeper ensemble of three elects one leader; killing it makes another
// member the leader.
func TestZooKeeperEnsembleLeader(t *testing.T) {
	e, err := testserver.StartZooKeeperEnsemble(3, testserver.ZooKeeperOptions{})
	stopAtEnd(t, e, err)
	if got := len(e.Addrs()); got != 3 {
		t.Fatalf("got %d addresses, want 3", got)
	}
	l, err := e.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Servers()[l].Kill(); err != nil {
		t.Fatal(err)
	}
	// An election under load may outlast one Leader call's own wait.
	awaitNewLeader(t, 30*time.Second, e.Leader, l)
	if err := e.Servers()[l].Restart(); err != nil {
		t.Errorf("restart the old leader: %v", err)
	}
}

// A partitionable etcd cluster: cutting the leader off makes the others
// elect a new leader, and healing lets the old one answer again.
func TestPartitionableEtcdCluster(t *testing.T) {
	c := startPartitionable(t, func() (*testserver.PartitionableEtcdCluster, error) {
		return testserver.StartPartitionableEtcdCluster(3)
	})
	l, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	idx := slices.Index(c.Members(), l)
	if err := c.Partition(idx); err != nil {
		t.Fatal(err)
	}
	awaitNewLeader(t, 20*time.Second, c.Leader, l)
	if err := c.Heal(idx); err != nil {
		t.Fatal(err)
	}
	within(t, 20*time.Second, "the healed member to answer", func() error {
		return etcdHealthOK(l.ClientURL())
	})
}

// etcdHealthOK returns nil if GET /health on url answers 200.
func etcdHealthOK(url string) error {
	_, err := testserver.EtcdHTTP(http.MethodGet, url+"/health", "")
	return err
}

// A partitionable ZooKeeper ensemble elects a new leader when the old one
// is cut off.
func TestPartitionableZooKeeperEnsemble(t *testing.T) {
	e := startPartitionable(t, func() (*testserver.PartitionableZooKeeperEnsemble, error) {
		return testserver.StartPartitionableZooKeeperEnsemble(3, testserver.ZooKeeperOptions{})
	})
	l, err := e.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Partition(l); err != nil {
		t.Fatal(err)
	}
	awaitNewLeader(t, 20*time.Second, e.Leader, l)
	if err := e.Heal(l); err != nil {
		t.Fatal(err)
	}
}

// A Redis Cluster of 3 primaries × 1 replica fails the slot of a key over
// to the replica when its primary is killed.
func TestReplicatedClusterFailover(t *testing.T) {
	c, err := testserver.StartReplicatedCluster(3, 1)
	stopAtEnd(t, c, err)
	if got := len(c.Addrs()); got != 6 {
		t.Fatalf("got %d nodes, want 6", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const key = "order:1001"
	p, err := c.PrimaryFor(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if p >= 3 {
		t.Fatalf("got primary %d for %q, want one of the first three", p, key)
	}
	if err := c.Nodes()[p].Kill(); err != nil {
		t.Fatal(err)
	}
	within(t, 25*time.Second, "a failover of the key's slot", func() error {
		p2, err := c.PrimaryFor(ctx, key)
		if err != nil {
			return err
		}
		if p2 == p {
			return fmt.Errorf("slot still served by node %d", p)
		}
		return nil
	})
}

// A partitionable Sentinel deployment: cutting the primary off makes the
// sentinels promote a replica, which takes writes; healing lets the old
// primary answer again.
func TestPartitionableSentinel(t *testing.T) {
	s := startPartitionable(t, func() (*testserver.PartitionableSentinel, error) {
		return testserver.StartPartitionableSentinel(2)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := s.Primary(ctx)
	if err != nil || p != 0 {
		t.Fatalf("Primary: got %d, %v, want 0, nil", p, err)
	}
	if err := s.Partition(0); err != nil {
		t.Fatal(err)
	}
	within(t, 30*time.Second, "a new primary", func() error {
		p, err = s.Primary(ctx)
		if err != nil {
			return err
		}
		if p == 0 {
			return fmt.Errorf("primary is still %s", s.Nodes()[0].Addr())
		}
		return nil
	})
	if v, err := s.Nodes()[p].Do(ctx, "SET", "k", "v"); err != nil || v != "OK" {
		t.Errorf("SET on the new primary: got %v, %v, want OK", v, err)
	}
	if err := s.Heal(0); err != nil {
		t.Fatal(err)
	}
	within(t, 30*time.Second, "the healed node to answer", func() error {
		_, err := s.Nodes()[0].Do(ctx, "PING")
		return err
	})
}

// awaitNewLeader polls leader until it names another leader than old,
// failing the test if that takes longer than d.
func awaitNewLeader[L comparable](t *testing.T, d time.Duration, leader func() (L, error), old L) {
	t.Helper()
	within(t, d, "a new leader", func() error {
		l, err := leader()
		if err != nil {
			return err
		}
		if l == old {
			return fmt.Errorf("leader is still %v", old)
		}
		return nil
	})
}

// stopAtEnd fails the test if topology s did not start (err), else stops
// it when the test ends.
func stopAtEnd(t *testing.T, s interface{ Stop() error }, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
}

// startPartitionable skips the test where network namespaces cannot be
// created; else it returns the topology start started, stopped (and its
// namespaces removed) when the test ends.
func startPartitionable[T interface{ Stop() error }](t *testing.T, start func() (T, error)) T {
	t.Helper()
	if err := testserver.NetNSAvailable(); err != nil {
		t.Skip(err)
	}
	top, err := start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := top.Stop(); err != nil {
			t.Error(err)
		}
	})
	return top
}
