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

//go:embed claim.lua
var claimLua string

var claimScript = redis.NewScript(claimLua)

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

// Claim reads the value under key and, in the same atomic step, records
// fence by owner as the highest accepted (the package rule applies), so
// that a holder with an older fence can no longer Set it. Use it for the
// read of a read-modify-write: a fence checked only on the write does not
// protect one, because the old holder could write between the new
// holder's read and its write. A rejected claim returns a *StaleError and
// changes nothing; a missing key reads as "".
func (r *Redis) Claim(ctx context.Context, key string, fence uint64, owner string) (string, error) {
	res, err := claimScript.Run(ctx, r.rdb, []string{key}, strconv.FormatUint(fence, 10), owner).Slice()
	if err != nil {
		return "", fmt.Errorf("dlock: fence: claim %q: %w", key, err)
	}
	if len(res) != 2 {
		return "", fmt.Errorf("dlock: fence: claim %q: unexpected reply %v", key, res)
	}
	if ok, _ := res[0].(int64); ok != 1 {
		hs, _ := res[1].(string)
		highest, _ := strconv.ParseUint(hs, 10, 64)
		return "", &StaleError{Resource: key, Fence: fence, Highest: highest}
	}
	v, _ := res[1].(string)
	return v, nil
}
