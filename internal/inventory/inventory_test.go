package inventory_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/inventory"
	"github.com/dlock-go/dlock/internal/locktest/testmain"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

var addr string

func TestMain(m *testing.M) {
	srv, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		testmain.Fail("inventory", err)
	}
	addr = srv.Addr()
	testmain.Run(m, "inventory", srv.Stop)
}

func newRedis() *redis.Client { return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 100}) }

var cfg = inventory.Config{Stock: 100, Instances: 3, Buyers: 50, Think: time.Millisecond}

// TestWithoutLockOversells is the negative control: the race is real.
// Each attempt is a full run; a run that happens not to race is retried.
func TestWithoutLockOversells(t *testing.T) {
	const attempts = 5
	for i := 1; i <= attempts; i++ {
		res, err := inventory.Run(context.Background(), cfg, "stock:nolock:"+t.Name(), newRedis, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("attempt %d without a lock: %d orders, final stock %d", i, res.Orders, res.FinalStock)
		if res.Oversold(cfg.Stock) {
			return
		}
	}
	t.Fatalf("no overselling or lost update observed in %d runs without a lock", attempts)
}

func TestWithLockExact(t *testing.T) {
	newClient := func(rdb *redis.Client) *dlock.Client {
		return dlock.New(redislock.New(rdb), dlock.WithTTL(5*time.Second))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := inventory.Run(ctx, cfg, "stock:lock:"+t.Name(), newRedis, newClient)
	if err != nil {
		t.Fatal(err)
	}
	if res.FinalStock != 0 || res.Orders != cfg.Stock || res.Errors != 0 {
		t.Fatalf("with dlock: got %d orders, final stock %d, %d errors; want %d orders, stock 0, no errors",
			res.Orders, res.FinalStock, res.Errors, cfg.Stock)
	}
	if res.SoldOut != cfg.Instances*cfg.Buyers-cfg.Stock {
		t.Fatalf("sold out answers: got %d, want %d", res.SoldOut, cfg.Instances*cfg.Buyers-cfg.Stock)
	}
}
