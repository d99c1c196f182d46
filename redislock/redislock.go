package redislock

import (
	"context"
	_ "embed"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// The scripts, embedded from their .lua files. redis.Script runs them with
// EVALSHA and falls back to EVAL when the server answers NOSCRIPT (after a
// restart or SCRIPT FLUSH); RefreshMany does the same for its pipeline.
var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed refresh.lua
	refreshSrc string
	//go:embed inspect.lua
	inspectSrc string

	acquireScript = redis.NewScript(acquireSrc)
	releaseScript = redis.NewScript(releaseSrc)
	refreshScript = redis.NewScript(refreshSrc)
	inspectScript = redis.NewScript(inspectSrc)
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
)

// Backend is a dlock.Backend on Redis. It implements dlock.Backend,
// dlock.BatchRefresher, dlock.Notifier, dlock.Inspector and
// dlock.ForceReleaser; it has no server-side queue (dlock.Waiter) yet, so
// the Client refuses WithFIFO. Create it with New; it is safe for
// concurrent use.
type Backend struct {
	rdb    Client
	cfg    config
	err    error  // from New: returned by every call
	server string // the server address(es), for error messages
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
	b := &Backend{cfg: defaultConfig()}
	b.hub.b = b
	b.hub.wsem = make(chan struct{}, 1)
	if isNil(rdb) {
		b.err = fmt.Errorf("redislock: %w: nil Client", dlock.ErrInvalidOption)
		return b
	}
	if _, ok := rdb.(*redis.Ring); ok {
		b.err = fmt.Errorf("redislock: %w: *redis.Ring is not supported (its shards do not share published messages); use a *redis.Client per shard or a *redis.ClusterClient", dlock.ErrInvalidOption)
		return b
	}
	b.rdb = rdb
	b.server, b.ctxDeadlines = describe(rdb)
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
// messages ("" if rdb does not tell), and whether rdb bounds socket I/O by
// context deadlines.
func describe(rdb Client) (string, bool) {
	switch c := rdb.(type) {
	case interface{ Options() *redis.Options }:
		o := c.Options()
		return o.Addr, o.ContextTimeoutEnabled
	case interface{ Options() *redis.ClusterOptions }:
		o := c.Options()
		return strings.Join(o.Addrs, ","), o.ContextTimeoutEnabled
	}
	return "", false
}

var errClosed = fmt.Errorf("redislock: %w", dlock.ErrClosed)

// lockName returns the name of the lock hash of key; fenceName and
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

// LockName returns the Redis key of the hash holding the lock key:
// PREFIX{KEY}. The fence counter is LockName(key)+":fence" and the release
// channel LockName(key)+":rel". It returns "" for an invalid key.
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
// counter. When another token holds the lock it returns Grant{OK: false}
// with HolderTTL set to the holder's remaining TTL (at least 1ms; 0 if the
// lock has no TTL). A lock or fence key that holds another type of value
// is an error matching dlock.ErrWrongType naming the key; nothing is
// changed.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := b.check(ctx, &r, true); err != nil {
		return dlock.Grant{}, err
	}
	lock := b.lockName(r.Key)
	keys := []string{lock, fenceName(lock)}
	token, ttl, re := r.Token, ttlArg(r.TTL), reentrantArg(r.Reentrant)
	run := func(ctx context.Context) (any, error) {
		return acquireScript.Run(ctx, b.rdb, keys, token, ttl, re).Result()
	}
	late := func(v any, err error) {
		// The caller gave up, but the server granted the lock: give it back.
		if g, gerr := parseGrant(v, err); gerr == nil && g.OK {
			ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
			defer cancel()
			releaseScript.Run(ctx, b.rdb, keys[:1], token, fenceArg(g.Fence), channelName(lock))
		}
	}
	v, err := guard(b, ctx, run, late)
	if err != nil {
		return dlock.Grant{}, b.callErr("acquire", r.Key, err)
	}
	g, err := parseGrant(v, nil)
	if err != nil {
		return dlock.Grant{}, err
	}
	return g, nil
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
	args := []any{r.Token, fenceArg(r.Fence), ttlArg(r.TTL)}
	run := func(ctx context.Context) (any, error) {
		return refreshScript.Run(ctx, b.rdb, keys, args...).Result()
	}
	v, err := guard(b, ctx, run, nil)
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
// gives up one hold of r.Token (and r.Fence, when set). When the lock
// becomes free it is deleted and a message is PUBLISHed on its release
// channel. When the token does not hold the lock it returns an error
// matching dlock.ErrNotHeld and changes nothing.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if err := b.check(ctx, &r, false); err != nil {
		return err
	}
	lock := b.lockName(r.Key)
	keys := []string{lock}
	args := []any{r.Token, fenceArg(r.Fence), channelName(lock)}
	run := func(ctx context.Context) (any, error) {
		return releaseScript.Run(ctx, b.rdb, keys, args...).Result()
	}
	v, err := guard(b, ctx, run, nil)
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
			args: []any{r.Token, fenceArg(r.Fence), ttlArg(r.TTL)},
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
	cmds, err := guard(b, ctx, run, nil)
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

// Inspect implements dlock.Inspector: it reads the lock's hash and PTTL in
// one script, changing nothing. Info.Waiters is -1: waiters are not
// queued on the server. A lock key holding another type of value is an
// error matching dlock.ErrWrongType.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	return b.inspect(ctx, "inspect", key, false)
}

// ForceRelease implements dlock.ForceReleaser: it deletes the lock
// whoever holds it, PUBLISHes on its release channel so waiters retry at
// once, and returns what it removed (Held false when there was nothing).
// The holder learns at its next renewal (ErrNotHeld, then its lease is
// lost). The fence counter is kept, so fences keep increasing. A lock key
// holding another type of value is an error matching dlock.ErrWrongType
// and is left intact.
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	return b.inspect(ctx, "force release", key, true)
}

func (b *Backend) inspect(ctx context.Context, op, key string, del bool) (dlock.Info, error) {
	if err := b.checkKey(ctx, key); err != nil {
		return dlock.Info{}, err
	}
	lock := b.lockName(key)
	keys := []string{lock}
	args := []any{reentrantArg(del), channelName(lock)}
	run := func(ctx context.Context) (any, error) {
		return inspectScript.Run(ctx, b.rdb, keys, args...).Result()
	}
	v, err := guard(b, ctx, run, nil)
	if err != nil {
		return dlock.Info{}, b.callErr(op, key, err)
	}
	info := dlock.Info{Key: key, Waiters: -1}
	a, _ := v.([]any)
	if len(a) == 0 {
		return dlock.Info{}, unexpected(op, v)
	}
	switch a[0] {
	case int64(0):
		return info, nil
	case int64(-1):
		return dlock.Info{}, wrongType(a, false)
	case int64(1):
		if len(a) == 5 {
			owner, ok1 := a[1].(string)
			count, ok2 := a[2].(int64)
			fence, ok3 := a[3].(int64)
			pttl, ok4 := a[4].(int64)
			if ok1 && ok2 && ok3 && ok4 {
				info.Held, info.Owner, info.Count, info.Fence = true, owner, int(count), uint64(max(fence, 0))
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
// deadline when rdb has ContextTimeoutEnabled.
func guard[T any](b *Backend, ctx context.Context, fn func(context.Context) (T, error), late func(T, error)) (T, error) {
	var zero T
	if ctx.Done() == nil {
		return fn(ctx)
	}
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if b.ctxDeadlines {
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
