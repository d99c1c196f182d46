package fence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

//go:embed set.lua
var setLua string

var setScript = redis.NewScript(setLua)

// Redis stores fenced values in Redis: each value is a hash holding the
// value, the highest fence accepted and its owner, updated by one script
// so the check and the write are atomic on the server.
type Redis struct {
	rdb RedisClient
}

// RedisClient is the part of a go-redis v9 client the store uses;
// *redis.Client, *redis.ClusterClient and redis.UniversalClient satisfy it.
type RedisClient interface {
	redis.Scripter
	HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd
}

// NewRedis returns a fenced store on rdb.
func NewRedis(rdb RedisClient) *Redis { return &Redis{rdb: rdb} }

// Set writes value under key if fence by owner is accepted (see the
// package rule); otherwise it returns a *StaleError and writes nothing.
// A key holding something other than a fenced value is an error.
func (r *Redis) Set(ctx context.Context, key, value string, fence uint64, owner string) error {
	res, err := setScript.Run(ctx, r.rdb, []string{key}, value, strconv.FormatUint(fence, 10), owner).Int64Slice()
	if err != nil {
		return fmt.Errorf("dlock: fence: set %q: %w", key, err)
	}
	if res[0] == 1 {
		return nil
	}
	return &StaleError{Resource: key, Fence: fence, Highest: uint64(res[1])}
}

// Get returns the value and the highest accepted fence under key; a
// missing key returns "", 0 and no error.
func (r *Redis) Get(ctx context.Context, key string) (value string, fence uint64, err error) {
	vals, err := r.rdb.HMGet(ctx, key, "v", "f").Result()
	if errors.Is(err, redis.Nil) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("dlock: fence: get %q: %w", key, err)
	}
	if vals[0] == nil {
		return "", 0, nil
	}
	value, _ = vals[0].(string)
	fs, _ := vals[1].(string)
	fence, err = strconv.ParseUint(fs, 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("dlock: fence: get %q: malformed fence %q", key, fs)
	}
	return value, fence, nil
}
