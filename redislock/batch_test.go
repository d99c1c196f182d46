package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// pipeHook counts the commands go-redis sends alone and in pipelines.
type pipeHook struct {
	alone, pipelines atomic.Int64
}

func (h *pipeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.alone.Add(1)
		return next(ctx, cmd)
	}
}

func (h *pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		return next(ctx, cmds)
	}
}

// batched is a Backend with WithClientPool and WithPipelines(1) on a server of the test's
// own, paused while its one call in flight waits for a reply.
type batched struct {
	b      *redislock.Backend
	rdb    *redis.Client
	hook   *pipeHook
	resume func()
	first  <-chan error // the call in flight's outcome
}

// batchSetup starts a batched; ctxTimeouts sets the client's
// ContextTimeoutEnabled.
func batchSetup(t *testing.T, ctxTimeouts bool) batched {
	t.Helper()
	r, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop() })
	rdb := newRDB(t, r.Addr(), func(o *redis.Options) {
		o.MaxRetries = -1
		o.ContextTimeoutEnabled = ctxTimeouts
	})
	hook := &pipeHook{}
	rdb.AddHook(hook)
	b := newBackend(t, rdb, redislock.WithClientPool(), redislock.WithPipelines(1))
	mustGrant(t, b, req(key(t)+"-warm", time.Minute)) // connect, load the scripts
	resume := pause(t, r)
	first := make(chan error, 1)
	go func() {
		_, err := b.TryAcquire(context.Background(), req(key(t)+"-first", time.Minute))
		first <- err
	}()
	waitFor(t, 5*time.Second, "the first call to be in flight", func() bool {
		in, _ := redislock.Batched(b)
		return in == 1
	})
	return batched{b, rdb, hook, resume, first}
}

// waiting waits until n calls of bt wait for the slot.
func (bt batched) waiting(t *testing.T, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, fmt.Sprintf("%d calls to wait for the slot", n), func() bool {
		_, waiting := redislock.Batched(bt.b)
		return waiting == n
	})
}

// TestPipelinesBatch checks that the calls made while the one pipeline
// slot is taken go together in one pipeline when it frees, each with its
// own reply.
func TestPipelinesBatch(t *testing.T) {
	bt := batchSetup(t, false)
	b, hook := bt.b, bt.hook
	const n = 19
	var wg sync.WaitGroup
	fences := make([]uint64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			g, err := b.TryAcquire(context.Background(), req(fmt.Sprintf("%s-%d", key(t), i), time.Minute))
			if err == nil && !g.OK {
				err = errors.New("not granted")
			}
			fences[i], errs[i] = g.Fence, err
		})
	}
	bt.waiting(t, n)
	alone, pipes := hook.alone.Load(), hook.pipelines.Load()
	bt.resume()
	wg.Wait()
	if err := <-bt.first; err != nil {
		t.Fatalf("first call: %v", err)
	}
	seen := map[uint64]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if seen[fences[i]] {
			t.Fatalf("call %d: fence %d given twice", i, fences[i])
		}
		seen[fences[i]] = true
	}
	if got := hook.alone.Load() - alone; got != 0 {
		t.Errorf("%d commands sent alone after the first, want 0", got)
	}
	if got := hook.pipelines.Load() - pipes; got != 1 {
		t.Errorf("%d pipelines, want 1", got)
	}
	if in, waiting := redislock.Batched(b); in != 0 || waiting != 0 {
		t.Errorf("after the calls: %d in flight, %d waiting, want none", in, waiting)
	}
}

// TestPipelinesCancelWaiting checks that a call whose context ends while
// it waits for the slot returns at once. With ContextTimeoutEnabled (the
// call runs on the caller's goroutine) it is never sent; without (it runs
// on a helper goroutine, see New) it is sent, and its grant given back.
func TestPipelinesCancelWaiting(t *testing.T) {
	for _, ctxTimeouts := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeouts), func(t *testing.T) {
			bt := batchSetup(t, ctxTimeouts)
			k := key(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			out := make(chan error, 1)
			go func() {
				_, err := bt.b.TryAcquire(ctx, req(k, time.Minute))
				out <- err
			}()
			bt.waiting(t, 1)
			cancel()
			if err := <-out; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled call: got %v, want context.Canceled", err)
			}
			pipes := bt.hook.pipelines.Load()
			bt.resume()
			if err := <-bt.first; err != nil {
				t.Fatalf("first call: %v", err)
			}
			if ctxTimeouts {
				if _, waiting := redislock.Batched(bt.b); waiting != 0 {
					t.Fatalf("%d calls still waiting after the cancellation, want 0", waiting)
				}
				if got := bt.hook.pipelines.Load() - pipes; got != 0 {
					t.Fatalf("%d pipelines sent after the cancellation, want 0", got)
				}
			}
			// Never sent, or given back: the lock is free for another token.
			waitFor(t, 5*time.Second, "every call to be done", func() bool {
				in, waiting := redislock.Batched(bt.b)
				return in == 0 && waiting == 0
			})
			waitFor(t, 5*time.Second, "the lock to be free", func() bool {
				return bt.rdb.Exists(context.Background(), bt.b.LockName(k)).Val() == 0
			})
			mustGrant(t, bt.b, dlock.Request{Key: k, Token: "other", TTL: time.Minute})
		})
	}
}

// TestPipelinesNoScript checks that a batch sent after the server lost
// its scripts runs them all.
func TestPipelinesNoScript(t *testing.T) {
	r, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop() })
	rdb := newRDB(t, r.Addr())
	b := newBackend(t, rdb, redislock.WithClientPool(), redislock.WithPipelines(1))
	hook := &pipeHook{}
	rdb.AddHook(hook)
	for round := range 3 {
		if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		err := locktest.Workers(16, 1, func(i, _ int) error {
			g, err := b.TryAcquire(context.Background(), req(fmt.Sprintf("%s-%d-%d", key(t), round, i), time.Minute))
			if err == nil && !g.OK {
				err = errors.New("not granted")
			}
			return err
		})
		if err != nil {
			t.Fatalf("round %d after SCRIPT FLUSH: %v", round, err)
		}
	}
	if hook.pipelines.Load() == 0 {
		t.Skip("no call was batched in three rounds (a quiet scheduler); nothing checked")
	}
}

// TestPipelinesServerGone checks that every call of a batch whose
// connection is gone fails with an error, none with an empty reply.
func TestPipelinesServerGone(t *testing.T) {
	bt := batchSetup(t, false)
	const n = 5
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := bt.b.TryAcquire(context.Background(), req(fmt.Sprintf("%s-%d", key(t), i), time.Minute))
			errs <- err
		}()
	}
	bt.waiting(t, n)
	if err := bt.rdb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-bt.first; err == nil {
		t.Fatal("first call: got nil, want an error")
	}
	for range n {
		if err := <-errs; err == nil || strings.Contains(err.Error(), "unexpected") {
			t.Errorf("batched call: got %v, want the connection's error", err)
		}
	}
}
