package verify

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// fenceCheckOff reports whether the backend URL a worker was given asks for
// WeakenNoFenceCheck.
func fenceCheckOff(url string) bool {
	_, mode := cutParam(url, WeakenParam)
	return mode == WeakenNoFenceCheck
}

// uncheckedRead reads the fenced register without claiming it: the read of
// WeakenNoFenceCheck. It never reports stale.
func (r *resource) uncheckedRead(ctx context.Context, _ uint64, _ string) (int64, bool, error) {
	s, err := r.rdb.HGet(ctx, r.key(ResourceFenced), "v").Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	v, err := parseValue(s)
	return v, false, err
}

// uncheckedWrite writes the fenced register in fence.Redis's layout
// without comparing fences: the write of WeakenNoFenceCheck.
func (r *resource) uncheckedWrite(ctx context.Context, v int64, f uint64, owner string) error {
	return r.rdb.HSet(ctx, r.key(ResourceFenced), "v", strconv.FormatInt(v, 10), "f", strconv.FormatUint(f, 10), "o", owner, "e", "0").Err()
}
