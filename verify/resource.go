package verify

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/fence"
)

// Resource names: the Key of read, write and final events.
const (
	ResourceFenced = "fenced"
	ResourceNaive  = "naive"
)

// resource is the protected store: two integer registers in a redis-server
// that is never faulted, each with a log of acknowledged increments.
type resource struct {
	rdb    *redis.Client
	store  *fence.Redis
	prefix string // "verify:RUN:"
}

func newResource(addr, prefix string) *resource {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		PoolSize:              4,
	})
	return &resource{rdb: rdb, store: fence.NewRedis(rdb), prefix: prefix}
}

func (r *resource) key(name string) string    { return r.prefix + name }
func (r *resource) logKey(name string) string { return r.prefix + name + ":log" }

// fencedRead reads the fenced register and claims it for fence and owner
// (fence.Redis.Claim). stale reports that a later fence had claimed it.
func (r *resource) fencedRead(ctx context.Context, f uint64, owner string) (v int64, stale bool, err error) {
	s, err := r.store.Claim(ctx, r.key(ResourceFenced), f, owner)
	if errors.Is(err, fence.ErrStale) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, err
	}
	v, err = parseValue(s)
	return v, false, err
}

// fencedWrite writes v with fence.Redis.Set; a rejected write returns a
// *fence.StaleError.
func (r *resource) fencedWrite(ctx context.Context, v int64, f uint64, owner string) error {
	return r.store.Set(ctx, r.key(ResourceFenced), strconv.FormatInt(v, 10), f, owner)
}

func (r *resource) naiveRead(ctx context.Context) (int64, error) {
	s, err := r.rdb.Get(ctx, r.key(ResourceNaive)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return parseValue(s)
}

func (r *resource) naiveWrite(ctx context.Context, v int64) error {
	return r.rdb.Set(ctx, r.key(ResourceNaive), strconv.FormatInt(v, 10), 0).Err()
}

// logIncrement appends an acknowledged increment to the register's log.
func (r *resource) logIncrement(ctx context.Context, name, entry string) error {
	return r.rdb.RPush(ctx, r.logKey(name), entry).Err()
}

// final returns the register's value and the length of its increment log.
func (r *resource) final(ctx context.Context, name string) (value, increments int64, err error) {
	switch name {
	case ResourceFenced:
		s, _, err := r.store.Get(ctx, r.key(name))
		if err != nil {
			return 0, 0, err
		}
		if value, err = parseValue(s); err != nil {
			return 0, 0, err
		}
	default:
		if value, err = r.naiveRead(ctx); err != nil {
			return 0, 0, err
		}
	}
	increments, err = r.rdb.LLen(ctx, r.logKey(name)).Result()
	return value, increments, err
}

func (r *resource) close() error { return r.rdb.Close() }

func parseValue(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("verify: register holds %q, not an integer", s)
	}
	return v, nil
}
