package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ---- the hand-off floor: a server-side queue, one PUBLISH per release ----

// handoffFloorSubject is the least a Redis lock with a server-side queue
// and one targeted wake-up per release can do: S3's baseline for a queued
// lock such as redislock. It is the least work, not a lock to use (see
// handoffLocker): waiters wake only on a release, so it skips S4.
func handoffFloorSubject() *subject {
	return &subject{
		id:                 "handoff-floor",
		name:               "hand-off floor: Lua queue + one PUBLISH per release",
		role:               roleFloor,
		server:             srvRedis,
		waitMode:           "server-side queue, one PUBLISH per release",
		wakesOnReleaseOnly: true,
		open: func(e *env, o openOpts) (locker, error) {
			return openHandoffLocker(newRedisClient(e.a.Redis, o.count, o.pool), o.ttl)
		},
	}
}

var (
	// handoffAcquire takes the lock KEYS[1] for the token ARGV[1] with a
	// TTL of ARGV[2] ms and returns 1, or queues the token on KEYS[2] and
	// returns 0.
	handoffAcquire = redis.NewScript(`if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end; redis.call('RPUSH', KEYS[2], ARGV[1]); return 0`)
	// handoffRelease, if the token ARGV[1] holds KEYS[1], hands the lock
	// to the first token queued on KEYS[2] (TTL ARGV[2] ms) and publishes
	// that token on its locker's channel, or deletes the lock when none
	// waits; it returns 1, or 0 if the token did not hold the lock.
	handoffRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end; local n = redis.call('LPOP', KEYS[2]); if n then redis.call('SET', KEYS[1], n, 'PX', ARGV[2]); redis.call('PUBLISH', 'hfloor:w:' .. string.match(n, '^[^/]*'), n) else redis.call('DEL', KEYS[1]) end; return 1`)
)

// handoffLocker is one client of the hand-off floor: a go-redis client for
// the scripts and one pub/sub connection subscribed to its own channel,
// "hfloor:w:" + id. lock runs handoffAcquire once; if that queued the
// token (id + "/" + random), it waits for the release that hands it the
// lock to publish the token on the channel, where route passes it to the
// waiting goroutine. unlock runs handoffRelease once.
//
// The least work, not a lock to use: no fences, no renewal, no skipping of
// dead waiters, and waiters wake only on a release, never on a lease's
// expiry. A lock call that ends (ctx, error) while queued leaves its token
// in the queue; the release that pops it hands the lock to no one, and the
// key stays held until its TTL ends while the rest of the queue waits on.
// A message published while the pub/sub connection reconnects is lost.
type handoffLocker struct {
	rdb   *redis.Client
	ps    *redis.PubSub
	id    string // the locker's random id: its channel and its tokens' prefix
	ttlMs int64

	mu      sync.Mutex
	waiting map[string]chan struct{} // by token; closed by route when its message arrives

	closing atomic.Bool
	done    chan struct{} // closed when route returns
}

// openHandoffLocker subscribes a new locker on rdb to its channel, waits
// for the subscription to be confirmed (before any lock) and starts
// route. It closes rdb if it fails.
func openHandoffLocker(rdb *redis.Client, ttl time.Duration) (*handoffLocker, error) {
	l := &handoffLocker{rdb: rdb, id: rand.Text(), ttlMs: ttl.Milliseconds(), waiting: map[string]chan struct{}{}, done: make(chan struct{})}
	ctx, cancel := opCtx()
	defer cancel()
	l.ps = rdb.Subscribe(ctx, "hfloor:w:"+l.id)
	v, err := l.ps.Receive(ctx)
	if err == nil {
		if _, ok := v.(*redis.Subscription); !ok {
			err = fmt.Errorf("hand-off floor: subscribe returned %v", v)
		}
	}
	if err != nil {
		return nil, errors.Join(err, l.ps.Close(), rdb.Close())
	}
	go l.route()
	return l, nil
}

// route reads the locker's pub/sub connection until close and closes the
// channel of the waiter each message (a token) names. A token no longer
// waiting (its lock call ended) is dropped. After an error it pauses
// 100 ms, as go-redis' own Channel does, and reads again (go-redis
// reconnects and subscribes again).
func (l *handoffLocker) route() {
	defer close(l.done)
	for {
		msg, err := l.ps.ReceiveMessage(context.Background())
		if err != nil {
			if l.closing.Load() {
				return
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		l.mu.Lock()
		woken := l.waiting[msg.Payload]
		delete(l.waiting, msg.Payload)
		l.mu.Unlock()
		if woken != nil {
			close(woken)
		}
	}
}

// forget unregisters token and reports whether it was still registered
// (false: route has already woken it).
func (l *handoffLocker) forget(token string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.waiting[token]
	delete(l.waiting, token)
	return ok
}

func (l *handoffLocker) lock(ctx context.Context, key string) (held, error) {
	lk := "hfloor:{" + key + "}"
	h := &handoffHeld{l: l, keys: []string{lk, lk + ":q"}, token: l.id + "/" + rand.Text()}
	// Registered before the script runs: the release may publish before
	// its reply arrives.
	woken := make(chan struct{})
	l.mu.Lock()
	l.waiting[h.token] = woken
	l.mu.Unlock()
	n, err := handoffAcquire.Run(ctx, l.rdb, h.keys, h.token, l.ttlMs).Int()
	if err != nil || n == 1 {
		l.forget(h.token)
		if err != nil {
			return nil, err
		}
		return h, nil
	}
	select {
	case <-woken:
		return h, nil
	case <-ctx.Done():
		if !l.forget(h.token) {
			// Handed the lock as ctx ended: pass it on.
			uctx, cancel := opCtx()
			_ = h.unlock(uctx)
			cancel()
		}
		return nil, ctx.Err()
	}
}

func (l *handoffLocker) close() error {
	l.closing.Store(true)
	err := l.ps.Close()
	<-l.done
	return errors.Join(err, l.rdb.Close())
}

type handoffHeld struct {
	l     *handoffLocker
	keys  []string // the lock and its queue
	token string
}

func (h *handoffHeld) unlock(ctx context.Context) error {
	n, err := handoffRelease.Run(ctx, h.l.rdb, h.keys, h.token, h.l.ttlMs).Int()
	if err == nil && n != 1 {
		return errors.New("hand-off floor: lock not held")
	}
	return err
}

func (h *handoffHeld) lost() bool { return false }
