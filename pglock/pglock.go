package pglock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
)

// MinTTL is the shortest lock TTL the backend accepts (and reports through
// Backend.MinTTL). A lease renewed every TTL/3 must survive a renewal
// round trip plus a retry: see "Minimum TTL" in the package documentation
// for the measurement behind it.
const MinTTL = 100 * time.Millisecond

// Backend is a dlock.Backend on a PostgreSQL lease table. Create it with
// New. It implements dlock.Backend, dlock.BatchRefresher, dlock.Notifier,
// dlock.Inspector, dlock.ForceReleaser and MinTTL (dlock.TTLFloor).
type Backend struct {
	pool  *pgxpool.Pool
	cfg   config
	err   error
	stmts statements

	setupSlot chan struct{} // holds one value while a call sets the schema up
	ready     atomic.Bool   // the schema was created or checked

	closed atomic.Bool
	quit   chan struct{} // closed by Close: ends the sweeper and the listener
	bgMu   sync.Mutex
	bgDone sync.WaitGroup
	sweep  bool // the sweeper runs

	lis   *listener // nil with WithoutListen
	freed freedKeys
	tries int // runs of a statement whose connection broke: the pool's size + 1
}

// maxFreed bounds the keys a freedKeys remembers.
const maxFreed = 1024

// freedKeys remembers the keys whose lock this Backend freed last with no
// waiter about (at most maxFreed; all are forgotten when it is full):
// TryAcquire tries them first with sqlAcquireFree. A key is forgotten
// when that finds no free row, or when a release of it wakes a waiter or
// leaves it held. It only chooses a statement; the statements decide.
type freedKeys struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

func (f *freedKeys) has(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.keys[key]
	return ok
}

func (f *freedKeys) add(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil || len(f.keys) >= maxFreed {
		f.keys = make(map[string]struct{})
	}
	f.keys[key] = struct{}{}
}

func (f *freedKeys) forget(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, key)
}

var errClosed = fmt.Errorf("pglock: %w", dlock.ErrClosed)

// New returns a Backend that keeps locks in tables of pool's database,
// configured by opts. New does not contact the server: the first call
// creates the schema (DefaultSchema unless WithSchema) if it does not
// exist, or checks that it is one this package created, with the expected
// tables, and that the role may use it. If pool is nil or an option is
// invalid, the Backend is still returned but every call on it fails with
// that error (matching dlock.ErrInvalidOption), which Err also returns.
//
// Every statement is a single statement in its own transaction, so pool
// may go through a transaction-pooling proxy (configure pgx with
// QueryExecModeExec or QueryExecModeSimpleProtocol there; prepared
// statements do not survive such a proxy). Release notifications need one
// session of their own: see WithListenConfig and WithoutListen.
func New(pool *pgxpool.Pool, opts ...Option) *Backend {
	b := &Backend{pool: pool, cfg: defaultConfig(), quit: make(chan struct{}), setupSlot: make(chan struct{}, 1)}
	if pool == nil {
		b.err = fmt.Errorf("pglock: %w: nil pool", dlock.ErrInvalidOption)
		return b
	}
	b.tries = int(pool.Config().MaxConns) + 1
	for _, o := range opts {
		if o == nil {
			b.err = fmt.Errorf("pglock: %w: nil Option", dlock.ErrInvalidOption)
			return b
		}
		if err := o(&b.cfg); err != nil {
			b.err = err
			return b
		}
	}
	b.stmts = newStatements(b.cfg.schema)
	if !b.cfg.noListen {
		lc := b.cfg.listen
		if lc == nil {
			lc = pool.Config().ConnConfig.Copy()
		}
		b.lis = newListener(b, lc)
	}
	return b
}

// Err returns the configuration error recorded by New, or nil.
func (b *Backend) Err() error { return b.err }

// Schema returns the schema holding the backend's tables.
func (b *Backend) Schema() string { return b.cfg.schema }

// MinTTL returns MinTTL: the shortest TTL the backend keeps alive.
func (b *Backend) MinTTL() time.Duration { return MinTTL }

// enter checks the Backend is usable and its schema is set up.
func (b *Backend) enter(ctx context.Context) error {
	if b.err != nil {
		return b.err
	}
	if b.closed.Load() {
		return errClosed
	}
	if err := b.setup(ctx); err != nil {
		return err
	}
	b.startBackground()
	return nil
}

// enterKey is enter for a call on key, which it checks first (checkKey).
func (b *Backend) enterKey(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	return b.enter(ctx)
}

// checkKey refuses a key that a PostgreSQL text value cannot hold: one
// with a NUL byte, or that is not valid UTF-8 (dlock.ValidateKey accepts
// both).
func checkKey(key string) error {
	if i := strings.IndexByte(key, 0); i >= 0 {
		return fmt.Errorf("pglock: %w: key %q has a NUL byte at offset %d, which PostgreSQL text cannot hold", dlock.ErrInvalidKey, shortKey(key), i)
	}
	if !utf8.ValidString(key) {
		i := 0
		for i < len(key) {
			r, n := utf8.DecodeRuneInString(key[i:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			i += n
		}
		return fmt.Errorf("pglock: %w: key %q is not valid UTF-8 (at offset %d), which PostgreSQL text requires", dlock.ErrInvalidKey, shortKey(key), i)
	}
	return nil
}

// shortKey is key cut to 64 bytes for an error message.
func shortKey(key string) string {
	if len(key) > 64 {
		return key[:64] + "..."
	}
	return key
}

func checkTTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return fmt.Errorf("pglock: %w: %v is below the minimum %v", dlock.ErrInvalidTTL, ttl, MinTTL)
	}
	return nil
}

// retryable reports whether err, from a statement run under ctx, is the
// failure of a pooled connection: not an error the server reported, not
// the context ending, not a failed dial (the server is unreachable).
func retryable(ctx context.Context, err error) bool {
	var (
		pe *pgconn.PgError
		ce *pgconn.ConnectError
	)
	return err != nil && ctx.Err() == nil && !errors.Is(err, pgx.ErrNoRows) && !errors.As(err, &pe) && !errors.As(err, &ce)
}

// retry runs op, and again while it fails with a broken connection
// (retryable), at most b.tries times in all; it returns op's last error.
// After a server restart every idle connection of the pool fails once
// and the pool discards it, so one run more than the pool holds
// connections reaches a new one. Callers use it where repeating op is
// safe.
func (b *Backend) retry(ctx context.Context, op func() error) error {
	err := op()
	for i := 1; i < b.tries && retryable(ctx, err); i++ {
		err = op()
	}
	return err
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func wrap(op string, err error) error {
	return fmt.Errorf("pglock: %s: %w", op, err)
}

// TryAcquire makes one attempt to take r.Key for r.Token with one
// statement (two when a key this Backend freed last was taken or swept
// since): a free or expired lock is granted with a new fence from the
// sequence; the holder's token re-enters when r.Reentrant (count + 1,
// deadline max(D, now + TTL)); otherwise it returns Grant{OK: false},
// with the holder's remaining TTL when a waiter of this Backend is
// subscribed to r.Key (0, unknown, otherwise).
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := b.enterKey(ctx, r.Key); err != nil {
		return dlock.Grant{}, err
	}
	if err := checkTTL(r.TTL); err != nil {
		return dlock.Grant{}, err
	}
	var (
		ok     bool
		fence  int64
		count  int
		remain int64
	)
	// The holder's TTL bounds a subscribed waiter's wait; the first
	// attempt of a wait is followed by a subscription and an immediate
	// retry, so it does without the answer and its cost.
	stmt := b.stmts.acquire[b2i(r.Reentrant)][b2i(b.lis.waiting(r.Key))]
	// sent reports whether the last statement may have reached the
	// server: one whose connection request failed, or that pgconn reports
	// safe to retry, did not, and has no grant to give back.
	sent := false
	run := func(stmt string) error {
		conn, err := b.pool.Acquire(ctx)
		if err != nil {
			sent = false
			return err
		}
		defer conn.Release()
		err = conn.QueryRow(ctx, stmt, r.Key, r.Token, r.TTL.Microseconds()).Scan(&ok, &fence, &count, &remain)
		sent = err == nil || !pgconn.SafeToRetry(err)
		return err
	}
	acquire := func() error {
		if !r.Reentrant && b.freed.has(r.Key) {
			// Most likely still free: the UPDATE alone is cheaper than
			// the upsert's conflict path.
			if err := run(b.stmts.acquireFree); !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			b.freed.forget(r.Key)
		}
		return run(stmt)
	}
	var err error
	if r.Reentrant {
		err = acquire() // a re-entry whose reply was lost may have counted
	} else {
		tried := false
		err = b.retry(ctx, func() error {
			if tried && sent {
				// The last try may have been granted before its
				// connection failed: give that grant back (the token is
				// this attempt's own), then try again.
				b.abandon(ctx, r)
			}
			tried = true
			return acquire()
		})
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return dlock.Grant{}, nil
	case err != nil:
		// The last run may have been granted before its reply was lost
		// (the context ended, or the connection broke on every run):
		// give that grant back. An error the server reported rolled the
		// statement back.
		var pe *pgconn.PgError
		if sent && !r.Reentrant && !errors.As(err, &pe) {
			b.abandon(ctx, r)
		}
		return dlock.Grant{}, wrap("acquire", err)
	case !ok:
		return dlock.Grant{HolderTTL: max(time.Duration(remain)*time.Microsecond, 0)}, nil
	}
	return dlock.Grant{OK: true, Fence: uint64(fence), Count: count}, nil
}

// abandonTimeout bounds the clean-up after an attempt whose reply was
// lost.
const abandonTimeout = time.Second

// abandon gives back a grant that an attempt may have made after its
// caller gave up (the statement can commit after the context ended). The
// token of a non-reentrant request is this attempt's own, so freeing a
// row of that token with count 1 touches no earlier grant. A grant that
// commits after the clean-up expires at its TTL.
func (b *Backend) abandon(ctx context.Context, r dlock.Request) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	_ = b.retry(cctx, func() error {
		return b.pool.QueryRow(cctx, b.stmts.release[0], r.Key, r.Token, int64(0)).Scan(nil)
	})
}

// Refresh sets the lock's deadline to max(deadline, now + r.TTL) if
// r.Token (and r.Fence, when set) still holds it unexpired; otherwise it
// returns an error matching dlock.ErrNotHeld and changes nothing.
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	if err := b.enterKey(ctx, r.Key); err != nil {
		return err
	}
	if err := checkTTL(r.TTL); err != nil {
		return err
	}
	var tag pgconn.CommandTag
	err := b.retry(ctx, func() (err error) { // setting the deadline to max(D, now + TTL) twice is once
		tag, err = b.pool.Exec(ctx, b.stmts.refresh[b2i(r.Fence != 0)], r.Key, r.Token, int64(r.Fence), r.TTL.Microseconds())
		return err
	})
	if err != nil {
		return wrap("refresh", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pglock: refresh: %w", dlock.ErrNotHeld)
	}
	return nil
}

// RefreshMany refreshes every request in one statement (requests for the
// same key after the first go in a statement of their own). The result has
// one entry per request: nil, an error matching dlock.ErrNotHeld, or the
// statement's error.
func (b *Backend) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	if b.err != nil || b.closed.Load() {
		return slices.Repeat([]error{b.enter(ctx)}, len(rs))
	}
	errs := make([]error, len(rs))
	var (
		keys, tokens []string
		fences, ttls []int64
		index        []int // position in rs of each batched request
		seen         = make(map[string]bool, len(rs))
		single       []int
	)
	for i, r := range rs {
		if err := checkKey(r.Key); err != nil {
			errs[i] = err
			continue
		}
		if err := checkTTL(r.TTL); err != nil {
			errs[i] = err
			continue
		}
		if seen[r.Key] {
			single = append(single, i)
			continue
		}
		seen[r.Key] = true
		keys, tokens = append(keys, r.Key), append(tokens, r.Token)
		fences, ttls = append(fences, int64(r.Fence)), append(ttls, r.TTL.Microseconds())
		index = append(index, i)
	}
	if len(index) > 0 {
		// Set up only for requests that passed the checks.
		if err := b.enter(ctx); err != nil {
			for _, i := range slices.Concat(index, single) {
				errs[i] = err
			}
			return errs
		}
		var held []int64
		err := b.retry(ctx, func() error {
			rows, err := b.pool.Query(ctx, b.stmts.refreshMany, keys, tokens, fences, ttls)
			if err == nil {
				held, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			}
			return err
		})
		if err != nil {
			for _, i := range index {
				errs[i] = wrap("refresh", err)
			}
		} else {
			ok := make([]bool, len(index))
			for _, h := range held {
				if h >= 1 && int(h) <= len(index) {
					ok[h-1] = true
				}
			}
			for j, i := range index {
				if !ok[j] {
					errs[i] = fmt.Errorf("pglock: refresh: %w", dlock.ErrNotHeld)
				}
			}
		}
	}
	for _, i := range single {
		errs[i] = b.Refresh(ctx, rs[i])
	}
	return errs
}

// Release gives up one hold of r.Token (and r.Fence, when set). The last
// hold frees the lock and wakes the oldest live waiter, in the same
// statement. When the token does not hold the lock unexpired it returns
// an error matching dlock.ErrNotHeld and changes nothing; a run after
// one whose reply was lost that finds the lock free returns nil.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if err := b.enterKey(ctx, r.Key); err != nil {
		return err
	}
	var (
		state int
		// ran reports whether a failed run may have reached the server
		// (pgconn.SafeToRetry says it did not), and so freed the lock.
		ran bool
	)
	release := func() error {
		err := b.pool.QueryRow(ctx, b.stmts.release[b2i(r.Fence != 0)], r.Key, r.Token, int64(r.Fence)).Scan(&state)
		ran = ran || (err != nil && !errors.Is(err, pgx.ErrNoRows) && !pgconn.SafeToRetry(err))
		return err
	}
	var err error
	if r.Reentrant {
		err = release() // not repeated: a reentrant count could drop twice
	} else {
		// A token of its own holds once: repeating the release can only
		// find the lock already freed by an earlier run, whose reply was
		// lost: the release happened.
		err = b.retry(ctx, release)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows) && ran:
		b.freed.forget(r.Key)
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("pglock: release: %w", dlock.ErrNotHeld)
	case err != nil:
		return wrap("release", err)
	case state == 1: // freed, no waiter about
		b.freed.add(r.Key)
	default:
		b.freed.forget(r.Key)
	}
	return nil
}

// Inspect returns the lock's state as the server sees it: holder, fence,
// count, remaining TTL and the number of live waiters.
func (b *Backend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	if err := b.enterKey(ctx, key); err != nil {
		return dlock.Info{}, err
	}
	var (
		token   *string
		fence   *int64
		count   *int
		remain  *int64
		waiters int64
	)
	err := b.retry(ctx, func() error {
		return b.pool.QueryRow(ctx, b.stmts.inspect, key).Scan(&token, &fence, &count, &remain, &waiters)
	})
	if err != nil {
		return dlock.Info{}, wrap("inspect", err)
	}
	info := dlock.Info{Key: key, Waiters: int(waiters)}
	if token != nil {
		info.Held, info.Owner, info.Fence, info.Count = true, *token, uint64(*fence), *count
		info.TTL = max(time.Duration(*remain)*time.Microsecond, 0)
	}
	return info, nil
}

// ForceRelease frees the lock whoever holds it and wakes the oldest live
// waiter. It returns what was removed (Held false when there was no live
// lock).
func (b *Backend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	if err := b.enterKey(ctx, key); err != nil {
		return dlock.Info{}, err
	}
	var (
		token  string
		fence  int64
		count  int
		remain int64
	)
	err := b.pool.QueryRow(ctx, b.stmts.forceRelease, key).Scan(&token, &fence, &count, &remain, nil)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && remain <= 0) {
		return dlock.Info{Key: key, Waiters: -1}, nil
	}
	if err != nil {
		return dlock.Info{}, wrap("force release", err)
	}
	return dlock.Info{Key: key, Held: true, Owner: token, Fence: uint64(fence), Count: count,
		TTL: time.Duration(remain) * time.Microsecond, Waiters: -1}, nil
}

// Close stops the sweeper and closes the listen session. It does not
// close the pool. Calls after Close fail with dlock.ErrClosed.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.bgMu.Lock()
	close(b.quit)
	b.bgMu.Unlock()
	b.bgDone.Wait()
	return nil
}

// startBackground starts the sweeper once.
func (b *Backend) startBackground() {
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if b.sweep || b.closed.Load() {
		return
	}
	b.sweep = true
	b.goBackground(b.sweepLoop)
}

// goBackground runs fn on a goroutine with a context that Close cancels;
// Close waits for it. Caller holds bgMu and has checked closed.
func (b *Backend) goBackground(fn func(ctx context.Context)) {
	b.bgDone.Add(1)
	go func() {
		defer b.bgDone.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-b.quit:
				cancel()
			case <-ctx.Done():
			}
		}()
		fn(ctx)
	}()
}

// sweepLoop deletes rows that expired (or were freed) more than a sweep
// interval ago. Such rows are free locks already (every statement compares
// expires with now()); they keep their key's last fence meanwhile.
func (b *Backend) sweepLoop(ctx context.Context) {
	t := time.NewTicker(b.cfg.sweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, b.cfg.sweep)
		var l, w int64
		_ = b.pool.QueryRow(sctx, b.stmts.sweep, b.cfg.sweep.Microseconds()).Scan(&l, &w)
		cancel()
	}
}
