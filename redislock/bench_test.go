package redislock_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// Run both in one go, so they share the machine's state:
//
//	go test -run '^$' -bench . -count 6 ./redislock/
//
// The target is BenchmarkAcquireRelease ≥ 0.9× the ops/s of
// BenchmarkRawSetNXRelease.

// BenchmarkAcquireRelease is an uncontended Acquire + Release through
// dlock.New(redislock.New(rdb)) with the default options (TTL 30s,
// auto-renew on) on a real redis-server: two round trips (the acquire and
// release scripts).
func BenchmarkAcquireRelease(b *testing.B) {
	rdb := newRDB(b, srv.Addr())
	c := dlock.New(redislock.New(rdb))
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()
	k := key(b)
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.Acquire(ctx, k)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireReleaseTimeout is BenchmarkAcquireRelease with a
// context that has a deadline, as most callers pass. With go-redis'
// default options each call then runs on a helper goroutine so that the
// context bounds it; with ContextTimeoutEnabled go-redis applies the
// deadline itself and the call runs directly.
func BenchmarkAcquireReleaseTimeout(b *testing.B) {
	for _, cte := range []bool{false, true} {
		name := "HelperGoroutine"
		if cte {
			name = "ContextTimeoutEnabled"
		}
		b.Run(name, func(b *testing.B) {
			rdb := newRDB(b, srv.Addr(), func(o *redis.Options) { o.ContextTimeoutEnabled = cte })
			c := dlock.New(redislock.New(rdb))
			b.Cleanup(func() { c.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			k := key(b)
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.Acquire(ctx, k)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// unlockScript is the classic compare-and-delete release.
var unlockScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then
	return redis.call("del", KEYS[1])
end
return 0`)

// BenchmarkRawSetNXRelease is the baseline: a raw SET key token NX PX and
// a Lua compare-and-delete (EVALSHA), with a fresh random token per
// acquisition as any lock needs: the least a Redis lock can do.
func BenchmarkRawSetNXRelease(b *testing.B) {
	rdb := newRDB(b, srv.Addr())
	ctx := context.Background()
	k := key(b)
	keys := []string{k}
	if err := unlockScript.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		token := rand.Text()
		ok, err := rdb.SetArgs(ctx, k, token, redis.SetArgs{Mode: "NX", TTL: 30 * time.Second}).Result()
		if err != nil || ok != "OK" {
			b.Fatalf("SET NX PX: %q, %v", ok, err)
		}
		n, err := unlockScript.Run(ctx, rdb, keys, token).Int()
		if err != nil || n != 1 {
			b.Fatalf("release: %d, %v", n, err)
		}
	}
}
