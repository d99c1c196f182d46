package redislock_test

import (
	"context"
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
