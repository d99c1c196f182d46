package main

import (
	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// newRedisBackend returns the redislock backend on rdb (a single node,
// Sentinel-managed primary or Cluster client). rdb is closed by the caller.
func newRedisBackend(rdb redislock.Client) (dlock.Backend, error) {
	b := redislock.New(rdb)
	if err := b.Err(); err != nil {
		return nil, err
	}
	return b, nil
}
