package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Reply codes of kind_acquire.lua besides codeGranted, codeHeld and
// codeWrongType.
const (
	codeKindMismatch = -2 // {-2, kind}: the key is held as another kind ("lock", "p", "r")
	codePermits      = -3 // {-3, permits}: the holders use another number of permits
)

// SupportsKind implements dlock.KindSupporter: semaphore permits
// (dlock.KindPermit) and read holds (dlock.KindRead). See "Permits and
// read holds" in the package documentation for how they are kept.
func (b *Backend) SupportsKind(k dlock.Kind) bool {
	return k == dlock.KindPermit || k == dlock.KindRead
}

// kindArg is the scripts' letter for a permit ("p") or a read hold ("r").
func kindArg(k dlock.Kind) string {
	if k == dlock.KindPermit {
		return "p"
	}
	return "r"
}

// sharedKeys returns the keys of the permit and read-hold scripts: the
// lock (the marker), the holds, the lock's queue, the writers' claims and
// the permit queue, cut from one string (one allocation for the names).
func sharedKeys(lock string) []string {
	n := len(lock)
	s := lock + ":h" + lock + ":q" + lock + ":x" + lock + ":pq"
	return []string{lock, s[:n+2], s[n+2 : 2*n+4], s[2*n+4 : 3*n+6], s[3*n+6:]}
}

// permitsArg returns the script argument for a number of permits (1 for
// read holds), without an allocation for the common small numbers.
func permitsArg(n int) any {
	if n >= 0 && n < len(smallInts) {
		return smallInts[n]
	}
	return strconv.Itoa(n)
}

// smallInts are the script arguments for 0 to 15, boxed once.
var smallInts = func() [16]any {
	var a [16]any
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// checkShared validates a permit or read-hold request.
func checkShared(r *dlock.Request) error {
	switch {
	case r.Kind != dlock.KindPermit && r.Kind != dlock.KindRead:
		return fmt.Errorf("redislock: %s holds: %w", r.Kind, errors.ErrUnsupported)
	case r.Kind == dlock.KindPermit && r.Permits < 1:
		return fmt.Errorf("redislock: %w: a semaphore needs at least 1 permit, got %d", dlock.ErrInvalidOption, r.Permits)
	case r.Reentrant:
		return fmt.Errorf("redislock: %w: %s holds are not reentrant", dlock.ErrInvalidOption, r.Kind)
	}
	return nil
}

// tryShared makes one attempt to take a permit or a read hold
// (kind_acquire.lua); member, when not "", is the permit queue member of
// a waiter whose turn it is, which a grant takes out of the queue. It
// returns the grant and, for a fresh one, the server time in µs.
func (b *Backend) tryShared(ctx context.Context, r dlock.Request, member string) (dlock.Grant, int64, error) {
	if err := checkShared(&r); err != nil {
		return dlock.Grant{}, 0, err
	}
	permits := 1
	if r.Kind == dlock.KindPermit {
		permits = r.Permits
	}
	keys := sharedKeys(b.lockName(r.Key))
	args := []any{r.Token, b.ttlArg(r.TTL), kindArg(r.Kind), permitsArg(permits), member}
	run := func(ctx context.Context) (reply, error) {
		return b.eval(ctx, kindAcquireScript, keys, args...)
	}
	late := func(v reply, err error) {
		// The caller gave up, but the server granted the hold: give it back.
		if g, _, gerr := parseShared(v.v, err, r); gerr == nil && g.OK {
			b.releaseSharedGrant(ctx, r, g.Fence)
		}
	}
	v, err := guard(b, ctx, direct, run, late)
	if err != nil {
		return dlock.Grant{}, 0, b.callErr("acquire", r.Key, err)
	}
	g, now, err := parseShared(v.v, nil, r)
	if err != nil {
		return dlock.Grant{}, 0, err
	}
	if g.OK {
		if err := b.replicated("acquire", r.Key, v); err != nil {
			b.releaseSharedGrant(ctx, r, g.Fence)
			return dlock.Grant{}, 0, err
		}
	}
	return g, now, nil
}

// parseShared reads kind_acquire.lua's reply.
func parseShared(v any, err error, r dlock.Request) (dlock.Grant, int64, error) {
	if err != nil {
		return dlock.Grant{}, 0, err
	}
	if a, ok := v.([]any); ok && len(a) == 2 {
		switch a[0] {
		case int64(codeKindMismatch):
			held := "a lock"
			switch a[1] {
			case "p":
				held = "a semaphore's permits"
			case "r":
				held = "read holds"
			}
			return dlock.Grant{}, 0, fmt.Errorf("redislock: %w: %q is held as %s, not with %s holds; nothing was changed", dlock.ErrWrongType, r.Key, held, r.Kind)
		case int64(codePermits):
			return dlock.Grant{}, 0, fmt.Errorf("redislock: %w: %q has %v permits, the request says %d; nothing was changed", dlock.ErrPermits, r.Key, a[1], r.Permits)
		}
	}
	return parseGrantClock(v, nil)
}

// releaseSharedGrant gives back a permit or read hold granted to r.Token
// with fence that will not be used, without ctx's cancellation.
func (b *Backend) releaseSharedGrant(ctx context.Context, r dlock.Request, fence uint64) {
	r.Fence = fence
	s, keys, args := b.releaseSharedCall(r)
	s.Run(context.WithoutCancel(ctx), b.rdb, keys, args...)
}

// releaseSharedCall returns the script, keys and arguments that give up
// r's permit or read hold.
func (b *Backend) releaseSharedCall(r dlock.Request) (*redis.Script, []string, []any) {
	lock := b.lockName(r.Key)
	return kindReleaseScript, sharedKeys(lock),
		[]any{r.Token, fenceArg(r.Fence), kindArg(r.Kind), channelName(lock), b.claimArg(), b.wakePrefix()}
}

// releaseShared gives up a permit or read hold (kind_release.lua): the
// last one hands the key to the first queued writer or frees it. It
// returns an error matching dlock.ErrNotHeld, and changes nothing, when
// r.Token's hold r.Fence is not held.
func (b *Backend) releaseShared(ctx context.Context, r dlock.Request) error {
	if err := checkShared(&r); err != nil {
		return err
	}
	s, keys, args := b.releaseSharedCall(r)
	v, err := b.runScript(ctx, "release", r.Key, s, keys, args)
	if err != nil {
		return err
	}
	return parseRelease(v, r.Key)
}

// refreshCall returns the script, keys and arguments that refresh r: a
// lock's (refresh.lua, with a leader's value when it has one) or a
// permit's or read hold's (kind_refresh.lua).
func (b *Backend) refreshCall(r dlock.Request) (*redis.Script, []string, []any) {
	lock := b.lockName(r.Key)
	args := []any{r.Token, fenceArg(r.Fence), b.ttlArg(r.TTL)}
	if r.Kind != dlock.KindLock {
		return kindRefreshScript, []string{lock, lock + ":h"}, append(args, kindArg(r.Kind))
	}
	keys := []string{lock}
	if r.Value != "" {
		keys = append(keys, valueName(lock))
	}
	return refreshScript, keys, args
}

// claimWriter makes r, a writer's attempt that found the key held and will be
// retried (r.Waiting), keep new readers out while readers hold the key
// (kind_claim.lua), for r.TTL or until withdrawn. It is best effort: a
// writer that waits in the queue keeps readers out by that too.
func (b *Backend) claimWriter(ctx context.Context, r dlock.Request) {
	lock := b.lockName(r.Key)
	keys := []string{lock, lock + ":x"}
	args := []any{r.Token, b.ttlArg(r.TTL), channelName(lock)}
	// Recorded before the call: a claim whose reply is lost is withdrawn
	// too.
	b.writers.Store(writerKey(lock, r.Token), struct{}{})
	if v, err := b.runScript(ctx, "claim", r.Key, kindClaimScript, keys, args); err == nil && v == int64(0) {
		b.writers.Delete(writerKey(lock, r.Token)) // readers left meanwhile: no claim
	}
}

// writerKey is the key of a writer's claim record in Backend.writers.
func writerKey(lock, token string) string { return lock + "\x00" + token }

// grantedWriter forgets the claim record of a writer r whose attempt on
// lock was granted (the grant ends the claim on the server).
func (b *Backend) grantedWriter(lock string, r dlock.Request) {
	if r.Waiting {
		b.writers.Delete(writerKey(lock, r.Token))
	}
}

// withdrawWriter takes back the claim of a writer that stopped waiting, and
// wakes the readers it kept out. It returns an error matching
// dlock.ErrNotHeld (the writer holds nothing), or the reason the call
// failed.
func (b *Backend) withdrawWriter(ctx context.Context, r dlock.Request) error {
	lock := b.lockName(r.Key)
	if _, claimed := b.writers.LoadAndDelete(writerKey(lock, r.Token)); !claimed {
		return notHeld("release", r.Key) // no claim of ours: nothing to withdraw
	}
	keys := []string{lock, lock + ":x"}
	args := []any{r.Token, "", channelName(lock)}
	v, err := b.runScript(ctx, "release", r.Key, kindClaimScript, keys, args)
	if err != nil {
		return err
	}
	if a, ok := v.([]any); ok && len(a) > 0 && a[0] == int64(codeWrongType) {
		return wrongType(a, true)
	}
	return notHeld("release", r.Key)
}

// waitShared waits for a read hold by notification: it watches the key's
// release channel (Watch) and tries again after each release message, and
// at the latest when the hold in the way may end (or every waiter TTL
// when that is unknown). r.FIFO changes nothing: read holds do not
// exclude one another, and writers go first (see the package
// documentation).
func (b *Backend) waitShared(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := checkShared(&r); err != nil {
		return dlock.Grant{}, err
	}
	ch, stop, err := b.Watch(ctx, r.Key)
	switch {
	case err == nil:
		defer stop()
	case errors.Is(err, errClosed):
		return dlock.Grant{}, errClosed
	case ctx.Err() != nil:
		return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
	}
	// Without the subscription the waiter still gets its hold, by the
	// retries below; the attempts report the server's errors.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if b.closed.Load() {
			return dlock.Grant{}, errClosed
		}
		sent := time.Now()
		g, _, err := b.tryShared(ctx, r, "")
		if err != nil {
			if ctx.Err() != nil {
				return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
			}
			return dlock.Grant{}, err
		}
		if g.OK {
			g.Since = sent
			return g, nil
		}
		d := b.cfg.waiterTTL
		if g.HolderTTL > 0 {
			d = g.HolderTTL
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return dlock.Grant{}, fmt.Errorf("redislock: wait %q: %w", r.Key, ctx.Err())
		case <-ch:
		case <-timer.C:
		}
	}
}

// inspectShared reads (or, with del, removes) the permit or read holds of
// key (kind_inspect.lua). ok is false when the key has none; nothing was
// changed then.
func (b *Backend) inspectShared(ctx context.Context, op, key string, del bool) (info dlock.Info, ok bool, err error) {
	lock := b.lockName(key)
	keys := sharedKeys(lock)
	args := []any{reentrantArg(del), channelName(lock), b.claimArg(), b.wakePrefix()}
	v, err := b.runScript(ctx, op, key, kindInspectScript, keys, args)
	if err != nil {
		return dlock.Info{}, false, err
	}
	a, _ := v.([]any)
	if len(a) == 1 && a[0] == int64(0) {
		return dlock.Info{}, false, nil
	}
	if len(a) > 0 && a[0] == int64(codeWrongType) {
		return dlock.Info{}, false, wrongType(a, false)
	}
	if len(a) < 5 || len(a)%2 == 0 || a[0] != int64(1) {
		return dlock.Info{}, false, unexpected(op, v)
	}
	kind, ok1 := a[1].(string)
	permits, ok2 := a[2].(int64)
	waiters, ok3 := a[3].(int64)
	now, ok4 := a[4].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return dlock.Info{}, false, unexpected(op, v)
	}
	info = dlock.Info{Key: key, Held: true, Kind: dlock.KindRead, Waiters: int(waiters)}
	if kind == "p" {
		info.Kind, info.Permits = dlock.KindPermit, int(permits)
	}
	for i := 5; i+1 < len(a); i += 2 {
		m, _ := a[i].(string)
		s, _ := a[i+1].(string)
		fence, token, found := strings.Cut(m, ":")
		f, err1 := strconv.ParseUint(fence, 10, 64)
		deadline, err2 := strconv.ParseFloat(s, 64)
		if !found || err1 != nil || err2 != nil {
			return dlock.Info{}, false, unexpected(op, v)
		}
		info.Holds = append(info.Holds, dlock.Hold{Owner: token, Fence: f, TTL: time.Duration(int64(deadline)-now) * time.Millisecond})
	}
	// A marker whose holds all ended keeps writers out until it expires,
	// but nobody holds the key.
	info.Held = len(info.Holds) > 0
	return info, true, nil
}
