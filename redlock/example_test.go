package redlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

// Locks over five independent Redis servers. (Not run: it needs the
// servers. The tests of this package run the same calls against real
// ones.)
func Example() {
	var rdbs []*redis.Client
	for _, addr := range []string{"10.0.0.1:6379", "10.0.1.1:6379", "10.0.2.1:6379", "10.0.3.1:6379", "10.0.4.1:6379"} {
		// No go-redis retries: Redlock tolerates a failed node, and a
		// retry only spends the node timeout.
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
		defer rdb.Close()
		rdbs = append(rdbs, rdb)
	}
	c := dlock.New(redlock.New(rdbs...), dlock.WithTTL(10*time.Second))
	defer c.Close()

	ctx := context.Background()
	err := c.Do(ctx, "order:1001", func(ctx context.Context, l *dlock.Lease) error {
		// Pass l.Fence() to the resource, which rejects lower fences.
		fmt.Println("fence", l.Fence())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// NewWithOptions takes a slice of clients and options: here a node timeout
// for nodes in other regions, 80 ms away.
func ExampleNewWithOptions() {
	rdbs := []redis.UniversalClient{
		redis.NewClient(&redis.Options{Addr: "eu.example:6379"}),
		redis.NewClient(&redis.Options{Addr: "us.example:6379"}),
		redis.NewClient(&redis.Options{Addr: "ap.example:6379"}),
	}
	b := redlock.NewWithOptions(rdbs, redlock.WithNodeTimeout(300*time.Millisecond))
	if err := b.Err(); err != nil {
		log.Fatal(err)
	}
	c := dlock.New(b, dlock.WithTTL(30*time.Second))
	defer c.Close()
}
