package redislock

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// valueName returns the key of an elected leader's value on lock.
func valueName(lock string) string { return lock + ":v" }

// SetValue implements dlock.Proclaimer: it stores r.Value as the value of
// r.Token's grant r.Fence of the lock r.Key (kind_value.lua), expiring
// with the lock; Inspect reports it in Info.Value while that grant holds
// the lock. It returns an error matching dlock.ErrNotHeld, and changes
// nothing, when the grant does not hold the lock.
func (b *Backend) SetValue(ctx context.Context, r dlock.Request) error {
	if err := b.check(ctx, &r, false); err != nil {
		return err
	}
	if r.Kind != dlock.KindLock {
		return notHeld("set value", r.Key)
	}
	lock := b.lockName(r.Key)
	keys := []string{lock, valueName(lock)}
	args := []any{r.Token, fenceArg(r.Fence), r.Value}
	v, err := b.runScript(ctx, "set value", r.Key, kindValueScript, keys, args)
	if err != nil {
		return err
	}
	return parseChange(v, "set value", r.Key, false)
}

// grantValue stores the value of a fresh grant g of r (a campaign), if
// r has one. When that fails, the grant is given back and the error
// returned.
func (b *Backend) grantValue(ctx context.Context, r dlock.Request, g dlock.Grant) error {
	if !g.OK || r.Value == "" {
		return nil
	}
	r.Fence = g.Fence
	if err := b.SetValue(ctx, r); err != nil {
		b.releaseGrant(ctx, r, g.Fence)
		return err
	}
	return nil
}

// inspected is inspect.lua's reply and the lock's value key (an elected
// leader's), read in one pipeline.
type inspected struct {
	v     any
	value string // FENCE ":" VALUE, "" when there is none
}

// runInspect runs inspect.lua on keys (the lock first) with args, behind
// a GET of the lock's value in the same pipeline: one round trip. After
// NOSCRIPT it sends both again with the script's source.
func (b *Backend) runInspect(ctx context.Context, keys []string, args []any) (inspected, error) {
	cmd, val := pipeScript(func(eval bool) (*redis.Cmd, *redis.StringCmd) {
		pipe := b.rdb.Pipeline()
		val := pipe.Get(ctx, valueName(keys[0]))
		cmd := queueEval(ctx, pipe, inspectScript, eval, keys, args)
		_, _ = pipe.Exec(ctx) // errors are per command
		return cmd, val
	})
	v, err := cmd.Result()
	if err != nil {
		return inspected{}, err
	}
	// A missing value, or one that is not a string: no value.
	value, _ := val.Result()
	return inspected{v: v, value: value}, nil
}

// valueOf returns the value stored for the grant fence, "" when the value
// key belongs to another grant or there is none.
func (in inspected) valueOf(fence uint64) string {
	f, val, ok := strings.Cut(in.value, ":")
	if !ok || f != strconv.FormatUint(fence, 10) {
		return ""
	}
	return val
}
