package redislock

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxBatch bounds how many calls one pipeline carries.
const maxBatch = 64

// A scriptCall is one script run: the script, its keys and arguments.
type scriptCall struct {
	s    *redis.Script
	keys []string
	args []any
}

// A batcher sends the script calls that a Backend's goroutines make at the
// same time together, as pipelines, at most max of them in flight (see
// doc.go, Pipelining). A call made while fewer are in flight is sent at
// once, alone.
type batcher struct {
	rdb Client
	max int

	mu       sync.Mutex
	inflight int
	pending  []*batchCall
}

// A batchCall is a call waiting in a batcher. Its goroutine waits on done
// for either its result or, with send set, the batch it must send itself.
type batchCall struct {
	scriptCall
	v    any
	err  error
	send []*batchCall
	done chan struct{}
}

// callPool holds batchCalls done with, to be used again.
var callPool = sync.Pool{New: func() any { return &batchCall{done: make(chan struct{}, 1)} }}

// recycle clears bc and puts it in callPool. Its goroutine calls it when
// bc is done with: unqueued, or its reply read (no one signals it again).
func (bc *batchCall) recycle() {
	bc.scriptCall, bc.v, bc.err, bc.send = scriptCall{}, nil, nil, nil
	callPool.Put(bc)
}

// run runs c on the server and returns its reply. A call sent alone is
// bound by ctx as go-redis binds it; a batch is sent with ctx's values
// only, bounded by the client's timeouts. A waiting call whose ctx ends
// returns ctx's error if it was not yet taken into a batch, and otherwise
// its reply when the batch's replies come.
func (bt *batcher) run(ctx context.Context, c scriptCall) (any, error) {
	bt.mu.Lock()
	if bt.inflight < bt.max {
		bt.inflight++
		bt.mu.Unlock()
		v, err := c.s.Run(ctx, bt.rdb, c.keys, c.args...).Result()
		bt.next()
		return v, err
	}
	bc := callPool.Get().(*batchCall)
	bc.scriptCall = c
	defer bc.recycle()
	bt.pending = append(bt.pending, bc)
	bt.mu.Unlock()
	select {
	case <-bc.done:
	case <-ctx.Done():
		if bt.unqueue(bc) {
			return nil, ctx.Err()
		}
		<-bc.done // taken: its reply, or its batch to send, is on its way
	}
	if batch := bc.send; batch != nil {
		bt.sendBatch(context.WithoutCancel(ctx), batch)
	}
	return bc.v, bc.err
}

// unqueue takes bc out of the waiting calls and reports whether it was
// there (not yet taken into a batch).
func (bt *batcher) unqueue(bc *batchCall) bool {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	for i, p := range bt.pending {
		if p == bc {
			bt.pending = append(bt.pending[:i], bt.pending[i+1:]...)
			return true
		}
	}
	return false
}

// sendBatch sends batch in one pipeline, passes the pipeline slot on, then
// hands every call its reply (batch[0] is the caller's own).
func (bt *batcher) sendBatch(ctx context.Context, batch []*batchCall) {
	cmds := runScripts(ctx, bt.rdb, len(batch), func(i int) scriptCall { return batch[i].scriptCall })
	bt.next()
	for i, m := range batch {
		m.v, m.err = cmds[i].Result()
		if i > 0 {
			m.done <- struct{}{}
		}
	}
}

// next passes the pipeline slot a send has finished with to the calls
// waiting meanwhile (their first call's goroutine sends them) or, when
// none wait, frees it.
func (bt *batcher) next() {
	bt.mu.Lock()
	if len(bt.pending) == 0 {
		bt.inflight--
		bt.mu.Unlock()
		return
	}
	n := min(len(bt.pending), maxBatch)
	batch := make([]*batchCall, n)
	copy(batch, bt.pending)
	bt.pending = append(bt.pending[:0], bt.pending[n:]...)
	batch[0].send = batch
	bt.mu.Unlock()
	batch[0].done <- struct{}{}
}

// runScripts runs n script calls, call(i) the i-th, in one pipeline (a
// ClusterClient splits it by node) and returns their commands. Those that
// fail with NOSCRIPT (the server lost its scripts: SCRIPT FLUSH, a
// restart) are sent again after a SCRIPT LOAD of each script, or with
// their source if that fails or only one did.
func runScripts(ctx context.Context, rdb Client, n int, call func(int) scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, n)
	pipe := rdb.Pipeline()
	for i := range n {
		c := call(i)
		cmds[i] = pipe.EvalSha(ctx, c.s.Hash(), c.keys, c.args...)
	}
	exec(ctx, pipe, cmds)
	again := noScript(cmds, nil)
	if len(again) > 1 {
		// Load each script once (on every shard, with a ClusterClient)
		// rather than send its source with every command.
		loaded := map[*redis.Script]bool{}
		for _, i := range again {
			if s := call(i).s; !loaded[s] {
				loaded[s] = s.Load(ctx, rdb).Err() == nil
			}
		}
		pipe := rdb.Pipeline()
		for _, i := range again {
			if c := call(i); loaded[c.s] {
				cmds[i] = pipe.EvalSha(ctx, c.s.Hash(), c.keys, c.args...)
			}
		}
		exec(ctx, pipe, cmds)
		again = noScript(cmds, again)
	}
	if len(again) > 0 {
		pipe := rdb.Pipeline()
		for _, i := range again {
			c := call(i)
			cmds[i] = c.s.Eval(ctx, pipe, c.keys, c.args...)
		}
		exec(ctx, pipe, cmds)
	}
	return cmds
}

// exec sends pipe, which holds some of cmds. go-redis gives up a pipeline
// whose retries all failed (a failover's broken connections) without
// setting its commands' errors: those get the pipeline's error, as their
// outcome is unknown. (A command that completed has a value or an error,
// redis.Nil for a nil reply, so only unsent ones are touched.)
func exec(ctx context.Context, pipe redis.Pipeliner, cmds []*redis.Cmd) {
	_, err := pipe.Exec(ctx) // otherwise errors are per command
	if err == nil {
		return
	}
	for _, c := range cmds {
		if c.Err() == nil && c.Val() == nil {
			c.SetErr(err)
		}
	}
}

// noScript returns the indexes (among idx, or all when idx is nil) of the
// commands that failed with NOSCRIPT.
func noScript(cmds []*redis.Cmd, idx []int) []int {
	var out []int
	check := func(j int) {
		if redis.HasErrorPrefix(cmds[j].Err(), "NOSCRIPT") {
			out = append(out, j)
		}
	}
	if idx == nil {
		for j := range cmds {
			check(j)
		}
	}
	for _, j := range idx {
		check(j)
	}
	return out
}

// script runs s with keys and args: on the Backend's own connection, or
// through its batcher, or alone without one (WithPipelines(0)).
func (b *Backend) script(ctx context.Context, s *redis.Script, keys []string, args []any) (any, error) {
	if b.pc != nil {
		return b.pc.run(ctx, s, keys, args)
	}
	if b.batch == nil {
		return s.Run(ctx, b.rdb, keys, args...).Result()
	}
	return b.batch.run(ctx, scriptCall{s, keys, args})
}
