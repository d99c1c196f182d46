package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated reports that an acquisition was not acknowledged by as
// many replicas as WithReplicas asks for within its timeout. The lock was
// released again (one hold of it, for a reentrant owner). Match it with
// errors.Is; it does not match dlock.ErrNotAcquired.
var ErrNotReplicated = errors.New("redislock: lock not replicated")

// reply is the outcome of one script run. With WithReplicas, acks is the
// number of replicas that acknowledged it (WAIT's reply) and waitErr the
// failure of WAIT itself; without, acks is -1.
type reply struct {
	v       any
	acks    int
	waitErr error
}

// eval runs s once. With WithReplicas it sends WAIT n timeout right behind
// the script in ONE pipeline, so both use the same connection (WAIT counts
// the writes of its own connection); on a ClusterClient the pipeline goes
// to the primary of keys[0]'s slot.
func (b *Backend) eval(ctx context.Context, s *redis.Script, keys []string, args ...any) (reply, error) {
	if b.cfg.replicas == 0 {
		v, err := b.script(ctx, s, keys, args)
		return reply{v: v, acks: -1}, err
	}
	var conn interface{ Pipeline() redis.Pipeliner } = b.rdb
	if cc, ok := b.rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return reply{}, err
		}
		conn = node
	}
	waitMs := int64(b.cfg.replWait / time.Millisecond)
	cmd, wait := pipeScript(func(eval bool) (*redis.Cmd, *redis.Cmd) {
		pipe := conn.Pipeline()
		cmd := queueEval(ctx, pipe, s, eval, keys, args)
		wait := pipe.Do(ctx, "wait", b.cfg.replicas, waitMs)
		if _, err := pipe.Exec(ctx); err != nil && cmd.Err() == nil && cmd.Val() == nil {
			// go-redis gives up a pipeline whose retries all failed (a
			// failover's broken connections) without setting its
			// commands' errors: the script's outcome is unknown.
			cmd.SetErr(err)
			wait.SetErr(err)
		}
		return cmd, wait
	})
	v, err := cmd.Result()
	if err != nil {
		return reply{}, err
	}
	acks, err := wait.Int64()
	return reply{v: v, acks: int(acks), waitErr: err}, nil
}

// pipeScript calls send, which sends a pipeline with a script in it, with
// false (the script by EVALSHA), and again with true (by EVAL, which loads
// it) when the script failed with NOSCRIPT. It returns send's results.
func pipeScript[T any](send func(eval bool) (*redis.Cmd, T)) (*redis.Cmd, T) {
	cmd, other := send(false)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd, other = send(true)
	}
	return cmd, other
}

// queueEval queues s with keys and args in pipe: by EVAL when eval is
// set, else by EVALSHA.
func queueEval(ctx context.Context, pipe redis.Pipeliner, s *redis.Script, eval bool, keys []string, args []any) *redis.Cmd {
	if eval {
		return s.Eval(ctx, pipe, keys, args...)
	}
	return s.EvalSha(ctx, pipe, keys, args...)
}

// replicated reports an error matching ErrNotReplicated when r was not
// acknowledged by enough replicas.
func (b *Backend) replicated(op, key string, r reply) error {
	switch {
	case r.acks < 0 || r.acks >= b.cfg.replicas && r.waitErr == nil:
		return nil
	case r.waitErr != nil:
		return fmt.Errorf("%w: %s %q: WAIT %d %v failed: %w", ErrNotReplicated, op, key, b.cfg.replicas, b.cfg.replWait, r.waitErr)
	case r.acks == 0:
		return fmt.Errorf("%w: %s %q: no replica acknowledged within %v, want %d (does the server have connected replicas?); the lock was released",
			ErrNotReplicated, op, key, b.cfg.replWait, b.cfg.replicas)
	}
	return fmt.Errorf("%w: %s %q: %d of %d replicas acknowledged within %v; the lock was released",
		ErrNotReplicated, op, key, r.acks, b.cfg.replicas, b.cfg.replWait)
}
