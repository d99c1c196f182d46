package verify_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/verify"
)

// TestMain doubles as the worker process: the coordinator re-executes the
// test binary with verify.WorkerEnv set (the helper-process pattern).
func TestMain(m *testing.M) {
	if os.Getenv(verify.WorkerEnv) == "1" {
		os.Exit(verify.WorkerMain(context.Background(), os.Args[1:], open))
	}
	goleak.VerifyTestMain(m)
}

// open is the tests' URL factory: redis:// on redislock, mem:// on one
// shared memlock (in-process workers only).
func open(_ context.Context, url string, _ time.Duration) (dlock.Backend, func() error, error) {
	switch {
	case strings.HasPrefix(url, "redis+sentinel://"), strings.HasPrefix(url, "redis+cluster://"):
		return openReplicated(url)
	case strings.HasPrefix(url, "redis://"):
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, err
		}
		opts.ContextTimeoutEnabled = true
		opts.DialTimeout = time.Second
		opts.ReadTimeout = time.Second
		opts.WriteTimeout = time.Second
		opts.MaxRetries = -1
		opts.PoolSize = 4
		rdb := redis.NewClient(opts)
		return redislock.New(rdb), rdb.Close, nil
	case strings.HasPrefix(url, "mem://"):
		return memlock.New(), nil, nil
	case strings.HasPrefix(url, "broken://"):
		return &brokenBackend{}, nil, nil
	}
	return nil, nil, fmt.Errorf("test factory: unsupported backend URL %q", url)
}

// workerExe re-executes this test binary as a worker.
func workerExe(t *testing.T) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe}
}

// brokenBackend grants every request, with increasing fences: a lock that
// excludes nothing, for checking that the harness notices.
type brokenBackend struct{ fence atomic.Uint64 }

func (b *brokenBackend) TryAcquire(context.Context, dlock.Request) (dlock.Grant, error) {
	return dlock.Grant{OK: true, Fence: b.fence.Add(1), Count: 1}, nil
}
func (b *brokenBackend) Refresh(context.Context, dlock.Request) error { return nil }
func (b *brokenBackend) Release(context.Context, dlock.Request) error { return nil }
func (b *brokenBackend) Close() error                                 { return nil }
