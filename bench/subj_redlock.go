package main

import (
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

// newRedlockBackend is the one place that builds dlock's Redlock backend
// over independent Redis nodes.
func newRedlockBackend(rdbs []*redis.Client) (dlock.Backend, error) {
	b := redlock.New(rdbs...)
	if err := b.Err(); err != nil {
		return nil, err
	}
	return b, nil
}

func redlockSubject() *subject {
	s := &subject{
		id:       "redlock",
		name:     "dlock redlock (5 nodes)",
		role:     roleDlock,
		server:   srvRedis5,
		renews:   true,
		waitMode: "pub/sub notification",
	}
	s.open = func(e *env, o openOpts) (locker, error) {
		rdbs := make([]*redis.Client, 0, len(e.a.Redis5))
		closers := make([]func() error, 0, len(e.a.Redis5))
		for _, addr := range e.a.Redis5 {
			rdb := newRedisClient(addr, o.count, o.pool)
			rdbs = append(rdbs, rdb)
			closers = append(closers, rdb.Close)
		}
		b, err := newRedlockBackend(rdbs)
		if err != nil {
			for _, fn := range closers {
				_ = fn()
			}
			return nil, err
		}
		return newDlockLocker(b, o, nil, closers...)
	}
	return s
}
