package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Part (a): the inventory story. Three service instances (three
// Redis connections pools, three dlock Clients: like three processes) each
// serve 100 buyers at once; the stock is 100. A buyer reads the stock,
// takes a moment (validating the order), and writes stock-1 back: a
// read-modify-write. Without a lock the buyers interleave and the stock
// oversells; under one dlock lock per SKU exactly 100 orders succeed.
const (
	invInstances = 3
	invBuyers    = 100 // per instance
	invStock     = 100
	invThink     = 2 * time.Millisecond // between reading and writing the stock
	invAttempts  = 3                    // runs without a lock, until one oversells
)

// redisNode returns a client for one demo server with the CLI's timeouts.
func (e *demoEnv) redisNode(addr string, poolSize int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		PoolSize:              poolSize,
		DialTimeout:           e.g.timeout,
		ReadTimeout:           e.g.timeout,
		WriteTimeout:          e.g.timeout,
		ContextTimeoutEnabled: true,
	})
}

type invOutcome struct {
	orders    int64 // purchases the shop accepted
	soldOut   int64 // buyers told "sold out"
	failed    int64 // buyers whose request failed
	stockLeft int64
	took      time.Duration
	firstErr  error
}

func partInventory(ctx context.Context, env *demoEnv, r *partResult) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	instances := make([]*redis.Client, invInstances)
	for i := range instances {
		instances[i] = env.redisNode(env.redis.Addr(), invBuyers)
		defer instances[i].Close()
	}
	stockKey, ordersKey := "demo:a:stock:sku-42", "demo:a:orders:sku-42"

	// Without a lock.
	var plain invOutcome
	attempts := 0
	for attempts < invAttempts {
		attempts++
		plain = runInventory(ctx, instances, stockKey, ordersKey, nil)
		if plain.firstErr != nil || plain.orders > invStock {
			break
		}
	}
	r.detail("without a lock: %d buyers, %d orders accepted for %d units, stock reads %d afterwards (%v)",
		invInstances*invBuyers, plain.orders, invStock, plain.stockLeft, plain.took.Round(time.Millisecond))
	r.fact("nolock_orders", plain.orders)
	r.fact("nolock_stock_left", plain.stockLeft)
	r.fact("nolock_runs", attempts)
	if plain.firstErr != nil {
		r.fail("the unlocked run failed: %v", plain.firstErr)
		r.Summary = "error: " + plain.firstErr.Error()
		return
	}
	if plain.orders > invStock {
		r.detail("  -> OVERSOLD by %d units; %d decrements were lost (orders + stock left = %d, want %d)",
			plain.orders-invStock, plain.orders+plain.stockLeft-invStock, plain.orders+plain.stockLeft, invStock)
		if attempts > 1 {
			r.detail("     (it took %d runs for the race to show)", attempts)
		}
	} else {
		r.fail("%d runs without a lock did not oversell (the race did not show on this machine)", attempts)
	}

	// With dlock: one lock per SKU, each instance its own Client.
	clients := make([]*dlock.Client, invInstances)
	for i, rdb := range instances {
		b, err := newRedisBackend(rdb)
		if err != nil {
			r.fail("redislock: %v", err)
			return
		}
		clients[i] = dlock.New(b, env.g.clientOptions(dlock.WithTTL(5*time.Second))...)
		defer clients[i].Close()
	}
	locked := runInventory(ctx, instances, stockKey, ordersKey, clients)
	r.detail("with dlock:     %d buyers, %d orders accepted for %d units, stock reads %d afterwards (%v)",
		invInstances*invBuyers, locked.orders, invStock, locked.stockLeft, locked.took.Round(time.Millisecond))
	r.fact("dlock_orders", locked.orders)
	r.fact("dlock_stock_left", locked.stockLeft)
	r.fact("dlock_sold_out", locked.soldOut)
	switch {
	case locked.firstErr != nil:
		r.fail("the locked run failed: %v", locked.firstErr)
	case locked.orders != invStock || locked.stockLeft != 0:
		r.fail("with dlock: %d orders and stock %d, want %d orders and stock 0", locked.orders, locked.stockLeft, invStock)
	default:
		r.detail("  -> exact: %d orders, stock 0, %d buyers told \"sold out\"", locked.orders, locked.soldOut)
	}
	r.Summary = fmt.Sprintf("no lock: %d orders for %d units (oversold %d); dlock: %d orders, stock %d",
		plain.orders, invStock, max(plain.orders-invStock, 0), locked.orders, locked.stockLeft)
}

// runInventory runs every buyer of every instance at once and returns the
// outcome. With clients nil the buyers take no lock.
func runInventory(ctx context.Context, instances []*redis.Client, stockKey, ordersKey string, clients []*dlock.Client) invOutcome {
	var out invOutcome
	if err := instances[0].Set(ctx, stockKey, invStock, 0).Err(); err != nil {
		out.firstErr = err
		return out
	}
	if err := instances[0].Del(ctx, ordersKey).Err(); err != nil {
		out.firstErr = err
		return out
	}
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		start   = make(chan struct{})
		soldOut atomic.Int64
		failed  atomic.Int64
	)
	record := func(err error) {
		failed.Add(1)
		errOnce.Do(func() { out.firstErr = err })
	}
	for i, rdb := range instances {
		for range invBuyers {
			wg.Go(func() {
				<-start
				buy := func(ctx context.Context) error {
					n, err := rdb.Get(ctx, stockKey).Int64()
					if err != nil {
						return err
					}
					if n <= 0 {
						soldOut.Add(1)
						return nil
					}
					time.Sleep(invThink) // validate the order, charge the card, ...
					if err := rdb.Set(ctx, stockKey, n-1, 0).Err(); err != nil {
						return err
					}
					return rdb.Incr(ctx, ordersKey).Err()
				}
				var err error
				if clients == nil {
					err = buy(ctx)
				} else {
					err = clients[i].Do(ctx, "sku-42", func(ctx context.Context, _ *dlock.Lease) error {
						return buy(ctx)
					})
				}
				if err != nil {
					record(err)
				}
			})
		}
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	out.took = time.Since(t0)
	out.soldOut, out.failed = soldOut.Load(), failed.Load()
	orders, err := instances[0].Get(ctx, ordersKey).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		errOnce.Do(func() { out.firstErr = err })
	}
	left, err := instances[0].Get(ctx, stockKey).Int64()
	if err != nil {
		errOnce.Do(func() { out.firstErr = err })
	}
	out.orders, out.stockLeft = orders, left
	return out
}
