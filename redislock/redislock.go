package redislock

import (
	"context"
	"crypto/rand"
	"fmt"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Client is the part of a go-redis v9 client the backend uses. It is
// satisfied by *redis.Client (including the failover client returned by
// redis.NewFailoverClient), *redis.ClusterClient and redis.UniversalClient.
// The backend never closes it. A *redis.Ring satisfies it too but is
// refused by New: its shards do not share published messages, so one
// subscription connection cannot hear every release.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = redis.UniversalClient(nil)

	_ dlock.Backend        = (*Backend)(nil)
	_ dlock.BatchRefresher = (*Backend)(nil)
	_ dlock.Inspector      = (*Backend)(nil)
	_ dlock.ForceReleaser  = (*Backend)(nil)
	_ dlock.Waiter         = (*Backend)(nil)
	_ dlock.MultiAcquirer  = (*Backend)(nil)
	_ dlock.TTLFloor       = (*Backend)(nil)
	_ dlock.KindSupporter  = (*Backend)(nil)
	_ dlock.Proclaimer     = (*Backend)(nil)
)

// Backend is a dlock.Backend on Redis. It implements dlock.Backend,
// dlock.BatchRefresher, dlock.Waiter (a server-side queue for every wait),
// dlock.MultiAcquirer, dlock.Inspector, dlock.ForceReleaser,
// dlock.TTLFloor, dlock.KindSupporter (semaphores and read-write locks)
// and dlock.Proclaimer (leader election). Create it with New; it is safe
// for concurrent use.
type Backend struct {
	rdb    Client
	cfg    config
	err    error  // from New: returned by every call
	server string // the server address(es), for error messages
	// id names this Backend in the FIFO queues (a member is id + token)
	// and ends its wake channel, wake: PREFIX "wake:" id.
	id, wake string
	// claim and wakePre are script arguments, boxed once: the claim TTL of
	// a lock handed to a FIFO waiter (ms), and PREFIX "wake:".
	claim, wakePre any
	// ttl caches the last lease TTL's script argument, as most callers use
	// one TTL.
	ttl atomic.Pointer[ttlBox]
	// writers is the writers' claims this Backend made (kind_claim.lua),
	// by lock name and token: only those are withdrawn on the server.
	writers sync.Map
	cluster *redis.ClusterClient // rdb, when it is one (slots for Groups)
	// ctxDeadlines reports that rdb bounds socket I/O by a context's
	// deadline (go-redis ContextTimeoutEnabled): calls through the pool
	// whose context has a deadline then run directly instead of on a
	// helper goroutine (see guard).
	ctxDeadlines bool
	closed       atomic.Bool
	hub          hub
	// pc is the Backend's own pipelined connection (nil when the client
	// is not one it can dial, with WithClientPool or WithReplicas), and
	// renew a second one for RefreshMany, whose large batches would hold
	// up the calls queued behind them.
	pc, renew *pipeConn
	// batch sends concurrent script calls together through the client's
	// pool (nil with pc, or with WithPipelines(0)).
	batch *batcher
	// tombs hints which locks granted with a fence floor may hold a
	// tombstone (see tombstones).
	tombs tombstones
}

// New returns a Backend that takes locks on the Redis server(s) behind rdb,
// configured by opts. New does not contact the server. If rdb is nil or an
// option is invalid, every call on the Backend fails with that error
// (matching dlock.ErrInvalidOption), which Err also returns. Every call
// returns when its context ends, whatever rdb's timeouts (package
// documentation, Contexts).
func New(rdb Client, opts ...Option) *Backend {
	// rand.Text is 26 characters: IDLEN in queue_lib.lua.
	b := &Backend{cfg: defaultConfig(), id: rand.Text()}
	b.hub.b = b
	b.hub.wsem = make(chan struct{}, 1)
	b.hub.wakeSem = make(chan struct{}, 1)
	if isNil(rdb) {
		b.err = fmt.Errorf("redislock: %w: nil Client", dlock.ErrInvalidOption)
		return b
	}
	if _, ok := rdb.(*redis.Ring); ok {
		b.err = fmt.Errorf("redislock: %w: *redis.Ring is not supported (its shards do not share published messages); use a *redis.Client per shard or a *redis.ClusterClient", dlock.ErrInvalidOption)
		return b
	}
	b.rdb = rdb
	b.cluster, _ = rdb.(*redis.ClusterClient)
	var readTimeout time.Duration
	b.server, b.ctxDeadlines, readTimeout = describe(rdb)
	for _, o := range opts {
		if o == nil {
			b.err = fmt.Errorf("redislock: %w: nil Option", dlock.ErrInvalidOption)
			return b
		}
		if err := o(&b.cfg); err != nil {
			b.err = err
			return b
		}
	}
	if b.cfg.replicas > 0 && readTimeout > 0 && b.cfg.replWait >= readTimeout {
		b.err = fmt.Errorf("redislock: %w: WithReplicas: timeout %v is not shorter than the client's ReadTimeout %v", dlock.ErrInvalidOption, b.cfg.replWait, readTimeout)
		return b
	}
	if !b.cfg.clientPool && b.cfg.replicas == 0 {
		b.pc = newPipeConn(rdb)
	}
	if b.pc != nil {
		b.renew = newPipeConn(rdb)
		// Closed with the Backend, or when it is garbage without Close.
		runtime.AddCleanup(b, (*pipeConn).close, b.pc)
		runtime.AddCleanup(b, (*pipeConn).close, b.renew)
	} else if b.cfg.pipelines > 0 {
		b.batch = &batcher{rdb: rdb, max: b.cfg.pipelines}
	}
	b.claim = ttlArg(b.cfg.waiterTTL)
	b.wakePre = b.cfg.prefix + "wake:"
	b.wake = b.cfg.prefix + "wake:" + b.id
	return b
}

// Err returns the configuration error recorded by New, or nil.
func (b *Backend) Err() error { return b.err }

func isNil(rdb Client) bool {
	if rdb == nil {
		return true
	}
	v := reflect.ValueOf(rdb)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// describe returns the address(es) of the servers behind rdb, for error
// messages ("" if rdb does not tell), whether rdb bounds socket I/O by
// context deadlines, and its read timeout (0 if unknown or none).
func describe(rdb Client) (string, bool, time.Duration) {
	switch c := rdb.(type) {
	case interface{ Options() *redis.Options }:
		o := c.Options()
		return o.Addr, o.ContextTimeoutEnabled, o.ReadTimeout
	case interface{ Options() *redis.ClusterOptions }:
		o := c.Options()
		return strings.Join(o.Addrs, ","), o.ContextTimeoutEnabled, o.ReadTimeout
	}
	return "", false, 0
}

var errClosed = fmt.Errorf("redislock: %w", dlock.ErrClosed)

// claimArg is the claim TTL of a lock handed over to a FIFO waiter.
func (b *Backend) claimArg() any { return b.claim }

// wakePrefix starts the wake channel of every Backend: the scripts append
// the Backend id of the waiter they serve.
func (b *Backend) wakePrefix() any { return b.wakePre }

// ttlBox is a lease TTL and its script argument.
type ttlBox struct {
	ttl time.Duration
	arg any
}

// ttlArg returns the script argument for the lease TTL ttl, boxed once per
// TTL in a row.
func (b *Backend) ttlArg(ttl time.Duration) any {
	if c := b.ttl.Load(); c != nil && c.ttl == ttl {
		return c.arg
	}
	c := &ttlBox{ttl, ttlArg(ttl)}
	b.ttl.Store(c)
	return c.arg
}

// checkKey validates what every call needs.
func (b *Backend) checkKey(ctx context.Context, key string) error {
	if b.err != nil {
		return b.err
	}
	if ctx == nil {
		return fmt.Errorf("redislock: %w: nil context", dlock.ErrInvalidOption)
	}
	if b.closed.Load() {
		return errClosed
	}
	return dlock.ValidateKey(key)
}

// check validates a request.
func (b *Backend) check(ctx context.Context, r *dlock.Request, needTTL bool) error {
	if err := b.checkKey(ctx, r.Key); err != nil {
		return err
	}
	if r.Token == "" {
		return fmt.Errorf("redislock: %w: empty owner token", dlock.ErrInvalidOption)
	}
	if needTTL && r.TTL < dlock.MinTTL {
		return fmt.Errorf("redislock: %w: %v is below the minimum %v", dlock.ErrInvalidTTL, r.TTL, dlock.MinTTL)
	}
	return nil
}

// ttlArg is the TTL in whole milliseconds, rounded up: the server never
// holds a lock for less time than the Client assumes.
func ttlArg(ttl time.Duration) string {
	return strconv.FormatInt(int64((ttl+time.Millisecond-1)/time.Millisecond), 10)
}

func fenceArg(fence uint64) string {
	if fence == 0 {
		return ""
	}
	return strconv.FormatUint(fence, 10)
}

func reentrantArg(r bool) string {
	if r {
		return "1"
	}
	return "0"
}

// TryAcquire implements dlock.Backend: one EVALSHA of acquire.lua, which
// takes a free lock (fence: the server time in µs, at least r.Fence when
// set, above a tombstone's), re-enters one r.Token holds (r.Reentrant), or
// reports the holder's remaining TTL in Grant.HolderTTL. It does not read
// the FIFO queue (see doc.go). A lock key holding another type of value is
// an error matching dlock.ErrWrongType; with WithReplicas, a grant too few
// replicas acknowledged is released and the error matches
// ErrNotReplicated.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	g, _, err := b.TryAcquireClock(ctx, r)
	return g, err
}

// TryAcquireClock is TryAcquire, also returning the server time (µs since
// 1970) at which a fresh grant was made, 0 for other outcomes. Package
// redlock uses it to learn how far the nodes' clocks run ahead.
func (b *Backend) TryAcquireClock(ctx context.Context, r dlock.Request) (dlock.Grant, int64, error) {
	if err := b.check(ctx, &r, true); err != nil {
		return dlock.Grant{}, 0, err
	}
	if r.Kind != dlock.KindLock {
		return b.tryShared(ctx, r, "")
	}
	lock := b.lockName(r.Key)
	keys := []string{lock}
	args := []any{r.Token, b.ttlArg(r.TTL), reentrantArg(r.Reentrant), fenceArg(r.Fence)}
	if r.Fence != 0 && b.tombs.expect(lock) {
		args = append(args, "1") // read the lock first (acquire.lua)
	}
	run := func(ctx context.Context) (reply, error) {
		return b.eval(ctx, acquireScript, keys, args...)
	}
	late := func(v reply, err error) {
		// The caller gave up, but the server granted the lock: give it back.
		if g, gerr := parseGrant(v.v, err); gerr == nil && g.OK {
			b.releaseGrant(ctx, r, g.Fence)
		}
	}
	v, err := guard(b, ctx, direct, run, late)
	if err != nil {
		return dlock.Grant{}, 0, b.callErr("acquire", r.Key, err)
	}
	g, now, err := parseGrantClock(v.v, nil)
	if err != nil {
		return dlock.Grant{}, 0, err
	}
	if g.OK {
		b.grantedWriter(lock, r)
		if r.Fence != 0 {
			b.tombs.note(lock, g.Fence, now)
		}
		if err := b.replicated("acquire", r.Key, v); err != nil {
			b.releaseGrant(ctx, r, g.Fence)
			return dlock.Grant{}, 0, err
		}
		if err := b.grantValue(ctx, r, g); err != nil {
			return dlock.Grant{}, 0, err
		}
	} else if r.Waiting && readersHold(v.v) {
		b.claimWriter(ctx, r) // keep new readers out while readers hold it
	}
	return g, now, nil
}

// releaseGrant gives back one hold that was granted to r.Token with fence
// but will not be used (the caller gave up, or it was not replicated). It
// runs without ctx's cancellation, bounded by the go-redis client's
// timeouts.
func (b *Backend) releaseGrant(ctx context.Context, r dlock.Request, fence uint64) {
	keys, channel := lockNames(b.lockName(r.Key))
	releaseScript.Run(context.WithoutCancel(ctx), b.rdb, keys, r.Token, fenceArg(fence), channel, b.claimArg(), b.wakePrefix())
}

// Refresh implements dlock.Backend: one EVALSHA of refresh.lua, which
// extends the lock to r.TTL if r.Token (and r.Fence, when set) still holds
// it, and otherwise returns an error matching dlock.ErrNotHeld and changes
// nothing.
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	if err := b.check(ctx, &r, true); err != nil {
		return err
	}
	s, keys, args := b.refreshCall(r)
	v, err := b.runScript(ctx, "refresh", r.Key, s, keys, args)
	if err != nil {
		return err
	}
	return parseRefresh(v, r.Key)
}

// Release implements dlock.Backend: one EVALSHA of release.lua, which
// gives up one hold of r.Token (and r.Fence, when set). When the last hold
// is given up, the lock goes to the first live FIFO waiter, with a new
// fence, reserved for it until it claims it (see Wait); when nobody is
// queued it is deleted and, if someone found it held meanwhile, a message
// is PUBLISHed on its release channel. When the token does not hold the
// lock it returns an error matching dlock.ErrNotHeld and changes nothing.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if err := b.check(ctx, &r, false); err != nil {
		return err
	}
	if r.Kind != dlock.KindLock {
		return b.releaseShared(ctx, r)
	}
	if r.Waiting && r.Fence == 0 {
		return b.withdrawWriter(ctx, r) // a writer that stopped waiting
	}
	keys, channel := lockNames(b.lockName(r.Key))
	args := []any{r.Token, fenceArg(r.Fence), channel, b.claimArg(), b.wakePrefix()}
	v, err := b.runScript(ctx, "release", r.Key, releaseScript, keys, args)
	if err != nil {
		return err
	}
	return parseRelease(v, r.Key)
}

// RefreshMany implements dlock.BatchRefresher: every refresh in one write
// on the Backend's own renewal connection, or in ONE pipeline through the
// pool (a
// ClusterClient splits it by node): one round trip per server. Refreshes
// that got NOSCRIPT (SCRIPT FLUSH, a restart) are sent again with the
// script. The result has one entry per request: nil, an error matching
// dlock.ErrNotHeld, or the reason the call failed.
func (b *Backend) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	errs := make([]error, len(rs))
	idx := make([]int, 0, len(rs))
	for i := range rs {
		if err := b.check(ctx, &rs[i], true); err != nil {
			errs[i] = err
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return errs
	}
	calls := make([]scriptCall, len(idx))
	for j, i := range idx {
		calls[j].s, calls[j].keys, calls[j].args = b.refreshCall(rs[i]) // refresh.lua, or kind_refresh.lua
	}
	run := func(ctx context.Context) ([]*redis.Cmd, error) {
		if b.renew != nil {
			return b.renew.runMany(ctx, calls), nil
		}
		return runScripts(ctx, b.rdb, len(calls), func(j int) scriptCall { return calls[j] }), nil
	}
	cmds, err := guard(b, ctx, direct, run, nil)
	for j, i := range idx {
		switch {
		case err != nil:
			errs[i] = b.callErr("refresh", rs[i].Key, err)
		case cmds[j].Err() != nil:
			errs[i] = b.callErr("refresh", rs[i].Key, cmds[j].Err())
		default:
			errs[i] = parseRefresh(cmds[j].Val(), rs[i].Key)
		}
	}
	return errs
}

// Inspect implements dlock.Inspector: it reads the lock, its PTTL and its
// queue's length in one script, changing nothing. Info.Waiters counts the
// queued waiters (dead ones until a release drops them). A lock key holding
// another type of value is an error matching dlock.ErrWrongType.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	return b.inspect(ctx, "inspect", key, false)
}

// ForceRelease implements dlock.ForceReleaser: it deletes the lock
// whoever holds it and returns what it removed (Held false when there was
// nothing). Like a release, it hands the lock to the first live waiter, or
// else PUBLISHes on its release channel. The holder learns at its next
// renewal (ErrNotHeld, then its lease is lost). Fences keep increasing
// (see Fencing in the package documentation). A lock key holding another
// type of value is an error matching dlock.ErrWrongType and is left intact.
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	return b.inspect(ctx, "force release", key, true)
}

func (b *Backend) inspect(ctx context.Context, op, key string, del bool) (dlock.Info, error) {
	if err := b.checkKey(ctx, key); err != nil {
		return dlock.Info{}, err
	}
	if del {
		// Permit or read holds are removed by their own script.
		if info, ok, err := b.inspectShared(ctx, op, key, true); ok || err != nil {
			return info, err
		}
	}
	lock := b.lockName(key)
	keys := lockKeys(lock)
	args := []any{reentrantArg(del), channelName(lock), b.claimArg(), b.wakePrefix()}
	run := func(ctx context.Context) (inspected, error) {
		return b.runInspect(ctx, keys, args)
	}
	res, err := guard(b, ctx, pooled, run, nil)
	if err != nil {
		return dlock.Info{}, b.callErr(op, key, err)
	}
	v := res.v
	info := dlock.Info{Key: key}
	a, _ := v.([]any)
	if len(a) == 0 {
		return dlock.Info{}, unexpected(op, v)
	}
	switch a[0] {
	case int64(codeHeld):
		if len(a) == 2 {
			if w, ok := a[1].(int64); ok {
				info.Waiters = int(w)
				return info, nil
			}
		}
	case int64(codeWrongType):
		return dlock.Info{}, wrongType(a, false)
	case int64(codeGranted):
		if len(a) == 6 {
			owner, ok1 := a[1].(string)
			count, ok2 := a[2].(int64)
			fence, ok3 := a[3].(int64)
			pttl, ok4 := a[4].(int64)
			waiters, ok5 := a[5].(int64)
			if ok1 && ok2 && ok3 && ok4 && ok5 && owner == "" && !del {
				// A marker: the key has permit or read holds.
				if info, ok, err := b.inspectShared(ctx, op, key, false); ok || err != nil {
					return info, err
				}
				return b.inspect(ctx, op, key, false) // changed meanwhile: read again
			}
			if ok1 && ok2 && ok3 && ok4 && ok5 {
				info.Held, info.Owner, info.Count, info.Fence = true, owner, int(count), uint64(max(fence, 0))
				info.Waiters = int(waiters)
				if pttl >= 0 {
					info.TTL = time.Duration(pttl) * time.Millisecond
				}
				info.Value = res.valueOf(info.Fence)
				return info, nil
			}
		}
	}
	return dlock.Info{}, unexpected(op, v)
}

// Close ends the Backend's own connections and its subscription
// connection, and their goroutines; it does not close the go-redis client
// passed to New. Calls still waiting for a reply and later calls fail with
// an error matching dlock.ErrClosed. Close is idempotent.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	if b.pc != nil {
		b.pc.close()
		b.renew.close()
	}
	return b.hub.close()
}

// callErr wraps a failed call with the operation, key and server.
func (b *Backend) callErr(op, key string, err error) error {
	if b.server == "" {
		return fmt.Errorf("redislock: %s %q: %w", op, key, err)
	}
	return fmt.Errorf("redislock: %s %q on %s: %w", op, key, b.server, err)
}

// runScript runs s on keys with args, bounded by ctx (see guard), and
// returns its reply, or the failure wrapped with op and key.
func (b *Backend) runScript(ctx context.Context, op, key string, s *redis.Script, keys []string, args []any) (any, error) {
	run := func(ctx context.Context) (any, error) {
		return b.script(ctx, s, keys, args)
	}
	v, err := guard(b, ctx, direct, run, nil)
	if err != nil {
		return nil, b.callErr(op, key, err)
	}
	return v, nil
}

// A route says how guard may run a call.
type route int

const (
	// direct: fn's commands go through b.script (the own connection when
	// the Backend has one) and may run on the caller's goroutine when the
	// transport itself ends a call at ctx's end.
	direct route = iota
	// learn: as direct, but the call must always learn its outcome, to
	// undo it: never run where a late reply would be lost.
	learn
	// pooled: fn uses the go-redis client whatever the transport.
	pooled
)

// guard runs fn so that ctx bounds it (see New) and returns ctx's error as
// soon as ctx ends; late, if not nil, is then called with fn's eventual
// result (to undo a grant nobody will use). On the own connection fn runs
// on the caller's goroutine and the connection hands a reply that comes
// too late to late. Otherwise, with a context that can end, fn runs on a
// helper goroutine with the context's values but not its cancellation, so
// its command always completes (or fails) within the client's timeouts;
// a context that cannot end (context.Background) costs nothing, nor does
// one with a deadline on a direct route when rdb has ContextTimeoutEnabled
// (late is then not called: the outcome is lost).
func guard[T any](b *Backend, ctx context.Context, rt route, fn func(context.Context) (T, error), late func(T, error)) (T, error) {
	v, _, err := guardLate(b, ctx, rt, fn, late)
	return v, err
}

// guardLate is guard, and reports whether it gave fn up while it ran:
// then, and only then, late is called (or will be).
func guardLate[T any](b *Backend, ctx context.Context, rt route, fn func(context.Context) (T, error), late func(T, error)) (T, bool, error) {
	var zero T
	if ctx.Done() == nil {
		v, err := fn(ctx)
		return v, false, err
	}
	if err := ctx.Err(); err != nil {
		return zero, false, err
	}
	if b.pc != nil && rt != pooled {
		var slot *lateSlot
		if late != nil {
			slot = &lateSlot{fn: func(v any, err error) { late(lateReply[T](v), err) }}
			ctx = context.WithValue(ctx, lateKey{}, slot)
		}
		v, err := fn(ctx)
		return v, slot != nil && slot.gaveUp, err
	}
	if rt == direct && b.ctxDeadlines {
		if _, ok := ctx.Deadline(); ok {
			v, err := fn(ctx)
			return v, false, err
		}
	}
	type result struct {
		v   T
		err error
	}
	out := make(chan result)
	gaveUp := make(chan struct{})
	go func() {
		v, err := fn(context.WithoutCancel(ctx))
		select {
		case out <- result{v, err}:
		case <-gaveUp:
			if late != nil {
				late(v, err)
			}
		}
	}()
	select {
	case r := <-out:
		return r.v, false, r.err
	case <-ctx.Done():
		close(gaveUp)
		return zero, true, ctx.Err()
	}
}

// lateReply returns a script's reply that the own connection read for a
// call given up as fn returns it: the calls with a late are b.eval's, whose
// result is a reply.
func lateReply[T any](v any) T {
	var t T
	if r, ok := any(&t).(*reply); ok {
		*r = reply{v: v, acks: -1}
	}
	return t
}

// Adopt hands the grant that key's lock has under token from to token to,
// with fence fence, keeping its hold count and deadline (agree.lua). It
// reports whether from held the lock; nothing changes when it did not. A
// lock key holding another type of value is an error matching
// dlock.ErrWrongType. Package redlock uses it to make the nodes that
// granted an acquisition agree on one fence.
func (b *Backend) Adopt(ctx context.Context, key, from, to string, fence uint64) (bool, error) {
	if err := b.checkKey(ctx, key); err != nil {
		return false, err
	}
	if from == "" || to == "" || fence == 0 {
		return false, fmt.Errorf("redislock: adopt %q: %w: empty token or zero fence", key, dlock.ErrInvalidOption)
	}
	keys := []string{b.lockName(key)}
	v, err := b.runScript(ctx, "adopt", key, agreeScript, keys, []any{from, to, strconv.FormatUint(fence, 10)})
	if err != nil {
		return false, err
	}
	switch v := v.(type) {
	case int64:
		switch v {
		case codeDone:
			return true, nil
		case codeNotHeld:
			return false, nil
		}
	case []any:
		if len(v) > 0 && v[0] == int64(codeWrongType) {
			return false, wrongType(v, false)
		}
	}
	return false, unexpected("adopt", v)
}
