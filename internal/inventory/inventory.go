// Package inventory is the oversell scenario: several instances of
// an order service decrement the same stock in Redis with a
// read-modify-write. Without a lock they oversell or lose updates; with a
// dlock lock around the read-modify-write the stock ends exactly at zero
// with exactly as many orders as there was stock. Used by tests and by
// `dlock demo`.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Config describes one run.
type Config struct {
	Stock     int           // initial stock, e.g. 100
	Instances int           // service instances, e.g. 3, each with its own connection and Client
	Buyers    int           // concurrent buyers per instance, e.g. 100
	Think     time.Duration // delay between reading and writing the stock (widens the race window)
}

// Result is what a run ended with.
type Result struct {
	Orders     int // successful purchases
	FinalStock int // stock left in Redis
	SoldOut    int // buyers told "sold out"
	Errors     int // buyers that failed otherwise
}

// Oversold reports whether more was sold than there was stock, or updates
// were lost (orders + final stock differ from the initial stock).
func (r Result) Oversold(initial int) bool {
	return r.FinalStock < 0 || r.Orders+r.FinalStock != initial
}

// ErrSoldOut is returned by a buy when the stock is zero.
var ErrSoldOut = errors.New("sold out")

// Run resets the stock under key and lets every buyer of every instance
// try to buy one item at once. newClient returns the lock Client of one
// instance, or nil to run without a lock. The Redis connections of each
// instance come from newRedis and are closed by Run.
func Run(ctx context.Context, cfg Config, key string, newRedis func() *redis.Client, newClient func(rdb *redis.Client) *dlock.Client) (Result, error) {
	admin := newRedis()
	defer admin.Close()
	if err := admin.Set(ctx, key, cfg.Stock, 0).Err(); err != nil {
		return Result{}, fmt.Errorf("inventory: reset stock: %w", err)
	}
	var orders, soldOut, failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < cfg.Instances; i++ {
		rdb := newRedis()
		defer rdb.Close()
		var c *dlock.Client
		if newClient != nil {
			c = newClient(rdb)
			defer c.Close()
		}
		for j := 0; j < cfg.Buyers; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				var err error
				if c == nil {
					err = buy(ctx, rdb, key, cfg.Think)
				} else {
					err = c.Do(ctx, key, func(ctx context.Context, _ *dlock.Lease) error {
						return buy(ctx, rdb, key, cfg.Think)
					})
				}
				switch {
				case err == nil:
					orders.Add(1)
				case errors.Is(err, ErrSoldOut):
					soldOut.Add(1)
				default:
					failed.Add(1)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	final, err := admin.Get(ctx, key).Int()
	if err != nil {
		return Result{}, fmt.Errorf("inventory: read stock: %w", err)
	}
	return Result{Orders: int(orders.Load()), FinalStock: final, SoldOut: int(soldOut.Load()), Errors: int(failed.Load())}, nil
}

// buy is the unprotected read-modify-write: read the stock,
// check it, write it back decremented.
func buy(ctx context.Context, rdb *redis.Client, key string, think time.Duration) error {
	s, err := rdb.Get(ctx, key).Result()
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	if n <= 0 {
		return ErrSoldOut
	}
	if think > 0 {
		time.Sleep(think)
	}
	return rdb.Set(ctx, key, n-1, 0).Err()
}
