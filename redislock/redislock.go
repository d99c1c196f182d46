package redislock

import (
	"context"
	"crypto/rand"
	"fmt"
	"reflect"
	"strconv"
	"strings"
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
	_ dlock.Notifier       = (*Backend)(nil)
	_ dlock.Inspector      = (*Backend)(nil)
	_ dlock.ForceReleaser  = (*Backend)(nil)
	_ dlock.Waiter         = (*Backend)(nil)
	_ dlock.MultiAcquirer  = (*Backend)(nil)
)

// Backend is a dlock.Backend on Redis. It implements dlock.Backend,
// dlock.BatchRefresher, dlock.Notifier, dlock.Waiter (a server-side FIFO
// queue for WithFIFO requests), dlock.MultiAcquirer, dlock.Inspector and
// dlock.ForceReleaser. Create it with New; it is safe for concurrent use.
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
	ttl     atomic.Pointer[ttlBox]
	cluster *redis.ClusterClient // rdb, when it is one (slots for Groups)
	// ctxDeadlines reports that rdb bounds socket I/O by a context's
	// deadline (go-redis ContextTimeoutEnabled): calls whose context has a
	// deadline then run directly instead of on a helper goroutine.
	ctxDeadlines bool
	closed       atomic.Bool
	hub          hub
}

// New returns a Backend that takes locks on the Redis server(s) behind rdb,
// configured by opts. New does not contact the server. If rdb is nil or an
// option is invalid, the Backend is still returned but every call on it
// fails with that error (matching dlock.ErrInvalidOption), which Err also
// returns.
//
// Every call returns when its context ends, even while the server is not
// answering and whatever rdb's timeout settings. go-redis bounds socket
// I/O by its ReadTimeout and WriteTimeout, and by a context's deadline
// only with ContextTimeoutEnabled, never by a cancellation. So a call
// whose context can end runs on a helper goroutine, and when the caller
// gives up the command still completes within rdb's timeouts; a lock that
// an abandoned TryAcquire took meanwhile is released at once. The one
// exception saves that goroutine: when rdb has ContextTimeoutEnabled and
// the context has a deadline, the call runs directly and go-redis ends it
// at the deadline (a cancellation before the deadline then waits for the
// reply, and a grant that arrives too late expires with its TTL).
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

// lockName returns the name of the lock hash of key; lockNames and
// channelName derive the fence counter's and the release channel's from
// it. All three share the hash tag {key}, so they live in the same Redis
// Cluster slot. A key starting with '}' or '\' gets a leading '\' inside
// the braces: a tag may not be empty, and the escape keeps distinct keys
// distinct.
func (b *Backend) lockName(key string) string {
	if key[0] == '}' || key[0] == '\\' {
		return b.cfg.prefix + "{\\" + key + "}"
	}
	return b.cfg.prefix + "{" + key + "}"
}

func fenceName(lock string) string   { return lock + ":fence" }
func channelName(lock string) string { return lock + ":rel" }

// lockKeys returns the four keys the scripts take: the lock hash, the
// fence counter, the FIFO queue and its heartbeats.
func lockKeys(lock string) []string {
	keys, _ := lockNames(lock)
	return keys
}

// lockNames returns lockKeys(lock) and the release channel, cut from one
// string: a single allocation for all the names.
func lockNames(lock string) (keys []string, channel string) {
	n := len(lock)
	s := lock + ":fence" + lock + ":q" + lock + ":hb" + lock + ":rel"
	return []string{lock, s[:n+6], s[n+6 : 2*n+8], s[2*n+8 : 3*n+11]}, s[3*n+11:]
}

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

// LockName returns the Redis key of the hash holding the lock key:
// PREFIX{KEY}. The fence counter is LockName(key)+":fence", the release
// channel LockName(key)+":rel", the FIFO queue LockName(key)+":q" and its
// heartbeats LockName(key)+":hb". It returns "" for an invalid key.
func (b *Backend) LockName(key string) string {
	if dlock.ValidateKey(key) != nil {
		return ""
	}
	return b.lockName(key)
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

// TryAcquire implements dlock.Backend: one EVALSHA of acquire.lua. The
// fence is max(last fence + 1, server time in µs), kept in the key's fence
// counter; with r.Fence set, a fresh grant's fence is at least r.Fence (a
// floor: package redlock proposes one so that its nodes agree). When another token holds the lock it returns Grant{OK: false}
// with HolderTTL set to the holder's remaining TTL (at least 1ms; 0 if the
// lock has no TTL). A free lock with live FIFO waiters (see Wait) is
// handed to the first of them instead, and the attempt fails like one that
// found it held: TryAcquire never overtakes the queue. A lock or fence key
// that holds another type of value is an error matching dlock.ErrWrongType
// naming the key; nothing is changed. With WithReplicas, a grant that too
// few replicas acknowledged is released again and the error matches
// ErrNotReplicated.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := b.check(ctx, &r, true); err != nil {
		return dlock.Grant{}, err
	}
	lock := b.lockName(r.Key)
	keys := lockKeys(lock)
	args := []any{r.Token, b.ttlArg(r.TTL), reentrantArg(r.Reentrant), b.claimArg(), b.wakePrefix(), fenceArg(r.Fence)}
	run := func(ctx context.Context) (reply, error) {
		return b.eval(ctx, acquireScript, keys, args...)
	}
	late := func(v reply, err error) {
		// The caller gave up, but the server granted the lock: give it back.
		if g, gerr := parseGrant(v.v, err); gerr == nil && g.OK {
			b.releaseGrant(r, g.Fence)
		}
	}
	v, err := guard(b, ctx, true, run, late)
	if err != nil {
		return dlock.Grant{}, b.callErr("acquire", r.Key, err)
	}
	g, err := parseGrant(v.v, nil)
	if err != nil {
		return dlock.Grant{}, err
	}
	if g.OK {
		if err := b.replicated("acquire", r.Key, v); err != nil {
			b.releaseGrant(r, g.Fence)
			return dlock.Grant{}, err
		}
	}
	return g, nil
}

// releaseGrant gives back one hold that was granted to r.Token with fence
// but will not be used (the caller gave up, or it was not replicated),
// with a fresh context bounded by dlock.DefaultReleaseTimeout.
func (b *Backend) releaseGrant(r dlock.Request, fence uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
	defer cancel()
	lock := b.lockName(r.Key)
	releaseScript.Run(ctx, b.rdb, lockKeys(lock), r.Token, fenceArg(fence), channelName(lock), b.claimArg(), b.wakePrefix())
}

func parseGrant(v any, err error) (dlock.Grant, error) {
	if err != nil {
		return dlock.Grant{}, err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return dlock.Grant{}, unexpected("acquire", v)
	}
	code, _ := a[0].(int64)
	switch code {
	case 1:
		fence, ok1 := a[1].(int64)
		count, ok2 := int64(1), true
		if len(a) > 2 {
			count, ok2 = a[2].(int64)
		}
		if !ok1 || !ok2 || fence <= 0 {
			return dlock.Grant{}, unexpected("acquire", v)
		}
		return dlock.Grant{OK: true, Fence: uint64(fence), Count: int(count)}, nil
	case 0:
		pttl, ok := a[1].(int64)
		if !ok {
			return dlock.Grant{}, unexpected("acquire", v)
		}
		var g dlock.Grant
		if pttl >= 0 {
			// PTTL rounds down: 0 means "under a millisecond left".
			g.HolderTTL = time.Duration(max(pttl, 1)) * time.Millisecond
		}
		return g, nil
	case -1:
		return dlock.Grant{}, wrongType(a, false)
	}
	return dlock.Grant{}, unexpected("acquire", v)
}

// Refresh implements dlock.Backend: one EVALSHA of refresh.lua, which
// extends the lock to r.TTL if r.Token (and r.Fence, when set) still holds
// it, and otherwise returns an error matching dlock.ErrNotHeld and changes
// nothing.
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	if err := b.check(ctx, &r, true); err != nil {
		return err
	}
	lock := b.lockName(r.Key)
	keys := []string{lock}
	args := []any{r.Token, fenceArg(r.Fence), b.ttlArg(r.TTL)}
	run := func(ctx context.Context) (any, error) {
		return refreshScript.Run(ctx, b.rdb, keys, args...).Result()
	}
	v, err := guard(b, ctx, true, run, nil)
	if err != nil {
		return b.callErr("refresh", r.Key, err)
	}
	return parseRefresh(v, r.Key)
}

func parseRefresh(v any, key string) error {
	switch v := v.(type) {
	case int64:
		switch v {
		case 1:
			return nil
		case 0:
			return notHeld("refresh", key)
		}
	case []any:
		if len(v) > 0 && v[0] == int64(-1) {
			return wrongType(v, true)
		}
	}
	return unexpected("refresh", v)
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
	keys, channel := lockNames(b.lockName(r.Key))
	args := []any{r.Token, fenceArg(r.Fence), channel, b.claimArg(), b.wakePrefix()}
	run := func(ctx context.Context) (any, error) {
		return releaseScript.Run(ctx, b.rdb, keys, args...).Result()
	}
	v, err := guard(b, ctx, true, run, nil)
	if err != nil {
		return b.callErr("release", r.Key, err)
	}
	switch v := v.(type) {
	case int64:
		switch v {
		case 1, 2:
			return nil
		case 0:
			return notHeld("release", r.Key)
		}
	case []any:
		if len(v) > 0 && v[0] == int64(-1) {
			return wrongType(v, true)
		}
	}
	return unexpected("release", v)
}

// RefreshMany implements dlock.BatchRefresher: every refresh in ONE
// pipeline, so one round trip per server (a ClusterClient splits the
// pipeline by node). If the server lost the script (SCRIPT FLUSH, a
// restart), the refreshes that got NOSCRIPT are sent again after a
// SCRIPT LOAD (or with EVAL, for a single one or if that fails). The result has one entry per request: nil, an error
// matching dlock.ErrNotHeld, or the reason the call failed.
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
	type call struct {
		keys []string
		args []any
	}
	calls := make([]call, len(idx))
	for j, i := range idx {
		r := rs[i]
		calls[j] = call{
			keys: []string{b.lockName(r.Key)},
			args: []any{r.Token, fenceArg(r.Fence), b.ttlArg(r.TTL)},
		}
	}
	run := func(ctx context.Context) ([]*redis.Cmd, error) {
		cmds := make([]*redis.Cmd, len(calls))
		pipe := b.rdb.Pipeline()
		for j, c := range calls {
			cmds[j] = pipe.EvalSha(ctx, refreshScript.Hash(), c.keys, c.args...)
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		again := noScript(cmds, nil)
		if len(again) > 1 {
			// Load the script once (on every shard, with a ClusterClient)
			// rather than send its source with every command.
			if refreshScript.Load(ctx, b.rdb).Err() == nil {
				pipe := b.rdb.Pipeline()
				for _, j := range again {
					cmds[j] = pipe.EvalSha(ctx, refreshScript.Hash(), calls[j].keys, calls[j].args...)
				}
				_, _ = pipe.Exec(ctx)
				again = noScript(cmds, again)
			}
		}
		if len(again) > 0 {
			pipe := b.rdb.Pipeline()
			for _, j := range again {
				cmds[j] = pipe.Eval(ctx, refreshSrc, calls[j].keys, calls[j].args...)
			}
			_, _ = pipe.Exec(ctx)
		}
		return cmds, nil
	}
	cmds, err := guard(b, ctx, true, run, nil)
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

// Inspect implements dlock.Inspector: it reads the lock's hash, PTTL and
// FIFO queue in one script, changing nothing. Info.Waiters counts the live
// FIFO waiters (see Wait); waiters that retry (without WithFIFO) are not
// queued on the server and are not counted. A lock key holding another
// type of value is an error matching dlock.ErrWrongType.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	return b.inspect(ctx, "inspect", key, false)
}

// ForceRelease implements dlock.ForceReleaser: it deletes the lock
// whoever holds it and returns what it removed (Held false when there was
// nothing). Like a release, it hands the lock to the first live FIFO
// waiter, or else PUBLISHes on its release channel so waiters retry at
// once. The holder learns at its next renewal (ErrNotHeld, then its lease
// is lost). The fence counter is kept, so fences keep increasing. A lock
// key holding another type of value is an error matching
// dlock.ErrWrongType and is left intact.
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	return b.inspect(ctx, "force release", key, true)
}

func (b *Backend) inspect(ctx context.Context, op, key string, del bool) (dlock.Info, error) {
	if err := b.checkKey(ctx, key); err != nil {
		return dlock.Info{}, err
	}
	lock := b.lockName(key)
	keys := lockKeys(lock)
	args := []any{reentrantArg(del), channelName(lock), b.claimArg(), b.wakePrefix()}
	run := func(ctx context.Context) (any, error) {
		return inspectScript.Run(ctx, b.rdb, keys, args...).Result()
	}
	v, err := guard(b, ctx, true, run, nil)
	if err != nil {
		return dlock.Info{}, b.callErr(op, key, err)
	}
	info := dlock.Info{Key: key}
	a, _ := v.([]any)
	if len(a) == 0 {
		return dlock.Info{}, unexpected(op, v)
	}
	switch a[0] {
	case int64(0):
		if len(a) == 2 {
			if w, ok := a[1].(int64); ok {
				info.Waiters = int(w)
				return info, nil
			}
		}
	case int64(-1):
		return dlock.Info{}, wrongType(a, false)
	case int64(1):
		if len(a) == 6 {
			owner, ok1 := a[1].(string)
			count, ok2 := a[2].(int64)
			fence, ok3 := a[3].(int64)
			pttl, ok4 := a[4].(int64)
			waiters, ok5 := a[5].(int64)
			if ok1 && ok2 && ok3 && ok4 && ok5 {
				info.Held, info.Owner, info.Count, info.Fence = true, owner, int(count), uint64(max(fence, 0))
				info.Waiters = int(waiters)
				if pttl >= 0 {
					info.TTL = time.Duration(pttl) * time.Millisecond
				}
				return info, nil
			}
		}
	}
	return dlock.Info{}, unexpected(op, v)
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

// Close ends the shared subscription connection and its goroutine. It
// does not close the go-redis client passed to New. Later calls fail with
// an error matching dlock.ErrClosed. Close is idempotent.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
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

func notHeld(op, key string) error {
	return fmt.Errorf("redislock: %s %q: %w", op, key, dlock.ErrNotHeld)
}

func unexpected(op string, v any) error {
	return fmt.Errorf("redislock: %s: unexpected reply %v from the script", op, v)
}

// wrongTypeError reports a lock or fence key that holds a value of another
// type (a user's list under the lock's name, say). It matches
// dlock.ErrWrongType, and dlock.ErrNotHeld when returned by Release or
// Refresh (the owner cannot hold a lock that is not there).
type wrongTypeError struct {
	key, kind string
	notHeld   bool
}

func (e *wrongTypeError) Error() string {
	if e.notHeld {
		return fmt.Sprintf("redislock: lock not held: key %q holds a %s, not a dlock lock; nothing was changed", e.key, e.kind)
	}
	return fmt.Sprintf("redislock: key %q holds a %s, not a dlock lock; nothing was changed", e.key, e.kind)
}

func (e *wrongTypeError) Is(target error) bool {
	return target == dlock.ErrWrongType || (e.notHeld && target == dlock.ErrNotHeld)
}

func wrongType(a []any, notHeld bool) error {
	e := &wrongTypeError{key: "?", kind: "value of another type", notHeld: notHeld}
	if len(a) > 1 {
		if s, ok := a[1].(string); ok {
			e.key = s
		}
	}
	if len(a) > 2 {
		if s, ok := a[2].(string); ok {
			e.kind = s
		}
	}
	return e
}

// guard runs fn so that ctx bounds it (see New). With a context that
// can end, fn runs on a helper goroutine with the context's values but not
// its cancellation, so its command always completes (or fails) within the
// client's timeouts; guard returns ctx's error as soon as ctx ends, and
// late, if not nil, is then called on the helper goroutine with fn's
// eventual result (to undo a grant nobody will use). A context that
// cannot end (context.Background) costs nothing, nor does one with a
// deadline when rdb has ContextTimeoutEnabled and direct is set (a call
// that must always learn its outcome, to undo it, passes false).
func guard[T any](b *Backend, ctx context.Context, direct bool, fn func(context.Context) (T, error), late func(T, error)) (T, error) {
	var zero T
	if ctx.Done() == nil {
		return fn(ctx)
	}
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if direct && b.ctxDeadlines {
		if _, ok := ctx.Deadline(); ok {
			return fn(ctx)
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
		return r.v, r.err
	case <-ctx.Done():
		close(gaveUp)
		return zero, ctx.Err()
	}
}
