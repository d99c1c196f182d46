package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/fencedfloor"
	"github.com/dlock-go/dlock/redislock"
)

// ---- the raw floor: SET NX PX + Lua compare-and-delete ----

var cadScript = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

func floorSubject() *subject {
	return redisFloorSubject("floor", "floor: SET NX PX + Lua delete",
		func(f redisFloor) locker { return &floorLocker{f} })
}

// redisFloorSubject returns the subject of a floor on one Redis server
// that polls every 2 ms; newLocker makes its locker.
func redisFloorSubject(id, name string, newLocker func(redisFloor) locker) *subject {
	return &subject{
		id:       id,
		name:     name,
		role:     roleFloor,
		server:   srvRedis,
		waitMode: "polls every 2 ms",
		open: func(e *env, o openOpts) (locker, error) {
			return newLocker(redisFloor{rdb: newRedisClient(e.a.Redis, o.count, o.pool), ttl: o.ttl, poll: o.poll}), nil
		},
	}
}

// redisFloor is what a floor on Redis holds: its client, the lock TTL and
// the interval between attempts.
type redisFloor struct {
	rdb       *redis.Client
	ttl, poll time.Duration
}

func (f redisFloor) close() error { return f.rdb.Close() }

// floorLocker is the least a Redis lock can do: one SET NX PX per attempt,
// a fixed sleep between attempts, one EVALSHA to release. No renewal.
type floorLocker struct{ redisFloor }

func (f *floorLocker) lock(ctx context.Context, key string) (held, error) {
	key = "floor:" + key
	token := rand.Text()
	return poll(ctx, f.poll, func() (held, error) {
		ok, err := f.rdb.SetNX(ctx, key, token, f.ttl).Result()
		if err != nil || !ok {
			return nil, err
		}
		return &floorHeld{f: f, key: key, token: token}, nil
	})
}

// poll runs try until it returns a held lock or an error, sleeping every
// between tries, until ctx ends: the floors' fixed-interval polling.
func poll(ctx context.Context, every time.Duration, try func() (held, error)) (held, error) {
	var t *time.Timer
	for {
		h, err := try()
		if err != nil || h != nil {
			return h, err
		}
		if t == nil {
			t = time.NewTimer(every)
			defer t.Stop()
		} else {
			t.Reset(every)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

type floorHeld struct {
	f          *floorLocker
	key, token string
}

func (h *floorHeld) unlock(ctx context.Context) error {
	n, err := cadScript.Run(ctx, h.f.rdb, []string{h.key}, h.token).Int()
	if err == nil && n != 1 {
		return errors.New("floor: lock not held")
	}
	return err
}

func (h *floorHeld) lost() bool { return false }

// ---- the fenced floor: the least a lock with redislock's fencing can do ----

func fencedFloorSubject() *subject {
	return redisFloorSubject("fenced-floor", "fenced floor: 2-call Lua acquire + 2-call Lua release",
		func(f redisFloor) locker { return &fencedLocker{f} })
}

// fencedLocker is the least a Redis lock with fencing tokens can do
// (package internal/fencedfloor, shared with redislock's benchmarks): one
// EVALSHA of fencedfloor.Acquire per attempt, a fixed sleep between
// attempts, one EVALSHA of fencedfloor.Release to release. No renewal.
type fencedLocker struct{ redisFloor }

func (f *fencedLocker) lock(ctx context.Context, key string) (held, error) {
	lk := "ffloor:{" + key + "}"
	keys := []string{lk, lk + ":fence"}
	token := rand.Text()
	return poll(ctx, f.poll, func() (held, error) {
		fence, err := fencedAcquire(ctx, f.rdb, keys, token, f.ttl.Milliseconds())
		if err != nil || fence == 0 {
			return nil, err
		}
		return &fencedHeld{f: f, keys: keys, token: token, fence: fence}, nil
	})
}

// fencedAcquire runs fencedfloor.Acquire once on rdb and returns the
// fence it granted, or 0 when the lock is held.
func fencedAcquire(ctx context.Context, rdb *redis.Client, keys []string, token string, ttlMs int64) (int64, error) {
	v, err := fencedfloor.Acquire.Run(ctx, rdb, keys, token, ttlMs).Slice()
	if err != nil {
		return 0, err
	}
	if len(v) != 2 {
		return 0, fmt.Errorf("fenced floor: acquire returned %v", v)
	}
	if v[0] != int64(1) {
		return 0, nil
	}
	fence, _ := v[1].(int64)
	return fence, nil
}

type fencedHeld struct {
	f     *fencedLocker
	keys  []string
	token string
	fence int64
}

func (h *fencedHeld) unlock(ctx context.Context) error {
	n, err := fencedfloor.Release.Run(ctx, h.f.rdb, h.keys, h.token, h.fence).Int()
	if err == nil && n != 1 {
		return errors.New("fenced floor: lock not held")
	}
	return err
}

func (h *fencedHeld) lost() bool { return false }

// ---- dlock, any backend ----

// dlockLocker is a dlock.Client with the options of the subject.
type dlockLocker struct {
	c       *dlock.Client
	opts    []dlock.Option
	closers []func() error
}

func newDlockLocker(b dlock.Backend, o openOpts, perCall []dlock.Option, closers ...func() error) (*dlockLocker, error) {
	c := dlock.New(b, dlock.WithTTL(o.ttl))
	if err := c.Err(); err != nil {
		_ = c.Close()
		for _, fn := range closers {
			_ = fn()
		}
		return nil, err
	}
	return &dlockLocker{c: c, opts: perCall, closers: closers}, nil
}

func (d *dlockLocker) lock(ctx context.Context, key string) (held, error) {
	l, err := d.c.Acquire(ctx, key, d.opts...)
	if err != nil {
		return nil, err
	}
	return dlockHeld{l}, nil
}

func (d *dlockLocker) close() error {
	errs := []error{d.c.Close()}
	for _, fn := range d.closers {
		errs = append(errs, fn())
	}
	return errors.Join(errs...)
}

type dlockHeld struct{ l *dlock.Lease }

func (h dlockHeld) unlock(ctx context.Context) error { return h.l.Release(ctx) }

func (h dlockHeld) lost() bool { return errors.Is(h.l.Err(), dlock.ErrLost) }

func (h dlockHeld) lossCause() string {
	if err := h.l.Err(); err != nil {
		return err.Error()
	}
	return "no error"
}

// redisFIFOReason says why dlock's Redis backend cannot queue waiters, or
// "" once it can (it implements dlock.Waiter).
func redisFIFOReason() string {
	if _, ok := any((*redislock.Backend)(nil)).(dlock.Waiter); !ok {
		return "FIFO: not available yet (redislock has no server-side queue)"
	}
	return ""
}

func dlockRedisSubject(fifo bool) *subject {
	s := &subject{
		id:       "redislock",
		name:     "dlock redislock",
		role:     roleDlock,
		server:   srvRedis,
		renews:   true,
		waitMode: "server-side queue, one targeted hand-off per release",
		serverKeys: func(e *env, prefix string) (int, error) {
			return scanCount(e.a.Redis, redislock.DefaultPrefix+"{"+prefix+"*", "string")
		},
	}
	var perCall []dlock.Option
	if fifo {
		s.id, s.name, s.waitMode = "redislock-fifo", "dlock redislock (FIFO)", "server-side queue"
		s.unavailable = redisFIFOReason
		perCall = []dlock.Option{dlock.WithFIFO()}
	}
	s.open = func(e *env, o openOpts) (locker, error) {
		if r := s.reason(); r != "" {
			return nil, unavailable("%s", r)
		}
		rdb := newRedisClient(e.a.Redis, o.count, o.pool)
		b := redislock.New(rdb)
		if err := b.Err(); err != nil {
			_ = rdb.Close()
			return nil, err
		}
		return newDlockLocker(b, o, perCall, rdb.Close)
	}
	return s
}

func memlockSubject(fifo bool) *subject {
	s := &subject{
		id:        "memlock",
		name:      "dlock memlock",
		role:      roleDlock,
		server:    srvMem,
		renews:    true,
		waitMode:  "in-process notification",
		inProcess: true,
	}
	var perCall []dlock.Option
	if fifo {
		s.id, s.name, s.waitMode = "memlock-fifo", "dlock memlock (FIFO)", "in-process queue"
		perCall = []dlock.Option{dlock.WithFIFO()}
	}
	s.open = func(e *env, o openOpts) (locker, error) {
		return newDlockLocker(e.mem.Backend(), o, perCall)
	}
	return s
}

// scanCount counts the keys of type typ matching pattern on a Redis server.
func scanCount(addr, pattern, typ string) (int, error) {
	rdb := newRedisClient(addr, nil, 1)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := 0
	iter := rdb.ScanType(ctx, 0, pattern, 10000, typ).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return n, iter.Err()
}
