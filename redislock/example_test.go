package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// Take a lock on a Redis server, do the work under the lease's context,
// and pass the fence to the resource. The example needs a server: it runs
// against $REDIS_ADDR when that is set (go test does not run it: it has
// no Output comment).
func Example() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.Do(ctx, "order:1001", func(ctx context.Context, l *dlock.Lease) error {
		// ctx is cancelled (cause dlock.ErrLost) if the lease is lost.
		fmt.Println("holding", l.Key(), "with fence", l.Fence())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A Redis Cluster: all the keys of one lock share the hash tag {key}, so
// any go-redis client works, here a ClusterClient.
func ExampleNew_cluster() {
	addr := os.Getenv("REDIS_CLUSTER_ADDR")
	if addr == "" {
		return
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
	defer rdb.Close()
	b := redislock.New(rdb, redislock.WithPrefix("app:lock:"))
	fmt.Println(b.LockName("order:1001")) // app:lock:{order:1001}
	c := dlock.New(b)
	defer c.Close()
	l, err := c.TryAcquire(context.Background(), "order:1001")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(context.Background())
}

// Fair waiting: with dlock.WithFIFO, waiters are served in arrival order
// from a queue on the server, and each release hands the lock to the next
// waiter directly.
func ExampleBackend_Wait() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := dlock.New(redislock.New(rdb), dlock.WithFIFO())
	defer c.Close()
	l, err := c.Acquire(context.Background(), "printer")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(context.Background())
}

// Several keys at once, all or nothing: on a single server they are taken
// in one script; on a Cluster, keys that share a hash tag are.
func ExampleBackend_TryAcquireAll() {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	c := dlock.New(redislock.New(rdb))
	defer c.Close()
	ls, err := c.AcquireMany(context.Background(), []string{"order:1", "order:2"})
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range ls {
		fmt.Println(l.Key(), "fence", l.Fence() > 0)
		l.Release(context.Background())
	}
}

// Confirm every acquisition on a replica: on a Sentinel deployment with
// one replica, an acquisition the replica did not acknowledge within
// 100ms is undone and fails with ErrNotReplicated.
func ExampleWithReplicas() {
	sentinel := os.Getenv("REDIS_SENTINEL_ADDR")
	if sentinel == "" {
		return
	}
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel}})
	defer rdb.Close()
	c := dlock.New(redislock.New(rdb, redislock.WithReplicas(1, 100*time.Millisecond)))
	defer c.Close()
	l, err := c.Acquire(context.Background(), "order:1001")
	if errors.Is(err, redislock.ErrNotReplicated) {
		log.Fatal("the replica is behind: ", err)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(context.Background())
}
