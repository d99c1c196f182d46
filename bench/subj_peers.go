package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	bsmlock "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

// ---- go-redsync/redsync ----

func redsyncSubject(nodes int) *subject {
	s := &subject{
		id:       "redsync",
		name:     "redsync (1 node)",
		role:     rolePeer,
		server:   srvRedis,
		waitMode: "polls every 2 ms",
	}
	if nodes > 1 {
		s.id, s.name, s.server = "redsync5", fmt.Sprintf("redsync (%d nodes)", nodes), srvRedis5
	}
	s.open = func(e *env, o openOpts) (locker, error) {
		addrs := []string{e.a.Redis}
		if nodes > 1 {
			addrs = e.a.Redis5
		}
		r := &redsyncLocker{ttl: o.ttl, poll: o.poll}
		var pools []rsredis.Pool
		for _, a := range addrs {
			rdb := newRedisClient(a, o.count, o.pool)
			r.rdbs = append(r.rdbs, rdb)
			pools = append(pools, goredis.NewPool(rdb))
		}
		r.rs = redsync.New(pools...)
		return r, nil
	}
	return s
}

// redsyncLocker waits the way redsync does (a fixed delay between tries);
// the tries are unlimited so that the caller's context bounds the wait.
type redsyncLocker struct {
	rs        *redsync.Redsync
	rdbs      []*redis.Client
	ttl, poll time.Duration
}

func (r *redsyncLocker) lock(ctx context.Context, key string) (held, error) {
	m := r.rs.NewMutex("redsync:"+key,
		redsync.WithExpiry(r.ttl),
		redsync.WithTries(math.MaxInt32),
		redsync.WithRetryDelay(r.poll))
	if err := m.LockContext(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, errors.Join(ctx.Err(), err)
		}
		return nil, err
	}
	return redsyncHeld{m}, nil
}

func (r *redsyncLocker) close() error {
	var errs []error
	for _, rdb := range r.rdbs {
		errs = append(errs, rdb.Close())
	}
	return errors.Join(errs...)
}

type redsyncHeld struct{ m *redsync.Mutex }

func (h redsyncHeld) unlock(ctx context.Context) error {
	ok, err := h.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock failed")
	}
	return err
}

func (h redsyncHeld) lost() bool { return false }

// ---- bsm/redislock ----

func bsmSubject() *subject {
	return &subject{
		id:       "bsm",
		name:     "bsm/redislock",
		role:     rolePeer,
		server:   srvRedis,
		waitMode: "polls every 2 ms",
		open: func(e *env, o openOpts) (locker, error) {
			rdb := newRedisClient(e.a.Redis, o.count, o.pool)
			return &bsmLocker{rdb: rdb, c: bsmlock.New(rdb), ttl: o.ttl, poll: o.poll}, nil
		},
	}
}

type bsmLocker struct {
	rdb       *redis.Client
	c         *bsmlock.Client
	ttl, poll time.Duration
}

func (b *bsmLocker) lock(ctx context.Context, key string) (held, error) {
	// LinearBackoff is stateless, so one Options value per call is enough.
	l, err := b.c.Obtain(ctx, "bsm:"+key, b.ttl, &bsmlock.Options{RetryStrategy: bsmlock.LinearBackoff(b.poll)})
	if err != nil {
		return nil, err
	}
	return bsmHeld{l}, nil
}

func (b *bsmLocker) close() error { return b.rdb.Close() }

type bsmHeld struct{ l *bsmlock.Lock }

func (h bsmHeld) unlock(ctx context.Context) error { return h.l.Release(ctx) }
func (h bsmHeld) lost() bool                       { return false }

// ---- rueidis' rueidislock ----

func rueidisSubject() *subject {
	return &subject{
		id:       "rueidislock",
		name:     "rueidislock",
		role:     rolePeer,
		server:   srvRedis,
		renews:   true,
		waitMode: "client-side-cache invalidation",
		serverKeys: func(e *env, prefix string) (int, error) {
			return scanCount(e.a.Redis, "rueidislock:0:"+prefix+"*", "string")
		},
		open: func(e *env, o openOpts) (locker, error) {
			opt := rueidis.ClientOption{InitAddress: []string{e.a.Redis}}
			if o.count != nil {
				opt.DialCtxFn = countingDial(o.count)
			}
			l, err := rueidislock.NewLocker(rueidislock.LockerOption{
				ClientOption: opt,
				// One key on the one server, like every other single-node
				// subject (the default, 2 of 3 keys, triples the work).
				KeyMajority: 1,
				KeyValidity: o.ttl,
				// Recommended for Redis ≥ 7.0.5, which this is.
				NoLoopTracking: true,
			})
			if err != nil {
				return nil, err
			}
			return &rueidisLocker{l: l}, nil
		},
	}
}

type rueidisLocker struct{ l rueidislock.Locker }

func (r *rueidisLocker) lock(ctx context.Context, key string) (held, error) {
	// The lock's context derives from ctx: it must outlive the hold.
	lctx, cancel, err := r.l.WithContext(ctx, key)
	if err != nil {
		return nil, err
	}
	return rueidisHeld{lctx, cancel}, nil
}

func (r *rueidisLocker) close() error {
	r.l.Close()
	return nil
}

type rueidisHeld struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// unlock cancels the lock's context; rueidislock then deletes its key and
// returns once that is done.
func (h rueidisHeld) unlock(context.Context) error {
	h.cancel()
	return nil
}

func (h rueidisHeld) lost() bool { return h.ctx.Err() != nil }
