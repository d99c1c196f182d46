package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
)

// SessionBackend is a dlock.Backend holding each lock as a session
// advisory lock, on a pooled connection it keeps for as long as the lock
// is held, and a row recording the grant's deadline: when the connection
// drops, the holder learns of the loss, and no one else is granted the
// lock before that deadline (a lock-delay). Create it with NewSession.
// It implements dlock.Backend, dlock.Notifier, dlock.LossNotifier,
// dlock.Inspector, dlock.ForceReleaser, dlock.BatchRefresher, MinTTL
// (dlock.TTLFloor) and MaxTTL (dlock.TTLLimiter). It needs PostgreSQL 14 or later
// (idle_session_timeout).
type SessionBackend struct {
	b *Backend // schema, fence sequence, waiters and listener

	mu   sync.Mutex
	held map[string]*session // by key
	gave sync.WaitGroup      // holds being given up in the background
}

var errReleased = errors.New("pglock: the lock was released")

// session is one held lock: its connection, holder and hold count.
type session struct {
	conn  *pgxpool.Conn
	key   string
	token string
	fence uint64
	count int
	pid   int32
	regs  int // live NotifyLoss registrations; guarded by SessionBackend.mu

	// slot holds one value while a statement runs on conn: the right to
	// use conn, taken by a send that waits within the caller's context.
	slot chan struct{}

	mu       sync.Mutex // guards the fields below; never held during I/O
	dead     error      // set once the connection failed
	onEnd    []func(error)
	lastOK   time.Time     // start of the last statement that succeeded on conn
	ttl      time.Duration // the lease's TTL: the session's idle timeout
	inflight *renewal      // the renewal due to start, if any
}

// renewal is one run of ping: done is closed once err is set.
type renewal struct {
	done chan struct{}
	err  error
}

// take waits for conn within ctx; on success the caller runs its
// statements, then calls give.
func (h *session) take(ctx context.Context) bool {
	select {
	case h.slot <- struct{}{}: // free: taken even if ctx has ended
		return true
	default:
	}
	select {
	case h.slot <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (h *session) give() { <-h.slot }

// NewSession returns a SessionBackend on pool, configured by opts (those
// of New; the schema holds the fence sequence and the waiters). Every
// held lock keeps one connection of pool out of it, so pool's size bounds
// the number of locks held at once; TryAcquire waits for a free
// connection within its context.
//
// The pool must reach the server directly or through session pooling: a
// transaction-pooling proxy would run the unlock on another session. The
// backend notices at the next renewal or release (the server process
// behind the connection changed, or the unlock found no lock) and reports
// an error saying so.
func NewSession(pool *pgxpool.Pool, opts ...Option) *SessionBackend {
	return &SessionBackend{b: New(pool, opts...), held: make(map[string]*session)}
}

// Err returns the configuration error recorded by NewSession, or nil.
func (s *SessionBackend) Err() error { return s.b.err }

// MinTTL returns MinTTL: the lease still has to be renewed (a renewal
// checks that the session is alive).
func (s *SessionBackend) MinTTL() time.Duration { return MinTTL }

// MaxSessionTTL is the longest TTL the session mode accepts (and reports
// through SessionBackend.MaxTTL): the largest idle_session_timeout, 2^31-1
// milliseconds (about 24.9 days).
const MaxSessionTTL = (1<<31 - 1) * time.Millisecond

// MaxTTL returns MaxSessionTTL (dlock.TTLLimiter): the session's idle
// timeout is set to the TTL, and cannot be longer.
func (s *SessionBackend) MaxTTL() time.Duration { return MaxSessionTTL }

// checkSessionTTL is checkTTL with the session mode's maximum.
func checkSessionTTL(ttl time.Duration) error {
	if ttl > MaxSessionTTL {
		return fmt.Errorf("pglock: %w: %v is above the session mode's maximum %v (idle_session_timeout, which the session is given as its TTL, is at most 2^31-1 ms)", dlock.ErrInvalidTTL, ttl, MaxSessionTTL)
	}
	return checkTTL(ttl)
}

// TryAcquire makes one attempt, one statement on a connection of its
// own: pg_try_advisory_lock, then, if the key's row is free, the row
// taken with a fence drawn from the sequence and expires now() + r.TTL.
// The holder's token re-enters in this process when r.Reentrant (a
// session lock cannot be shared with another process), once a renewal
// has set the deadline to at least now + r.TTL. A held lock, or
// the live row of a grant whose session ended without a release, returns
// Grant{OK: false}, with the row's remaining TTL when a waiter of this
// SessionBackend is subscribed to r.Key (0, unknown, otherwise).
func (s *SessionBackend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := s.b.enterKey(ctx, r.Key); err != nil {
		return dlock.Grant{}, err
	}
	if err := checkSessionTTL(r.TTL); err != nil {
		return dlock.Grant{}, err
	}
	s.mu.Lock()
	if h := s.held[r.Key]; h != nil {
		s.mu.Unlock()
		if h.token != r.Token || !r.Reentrant {
			return dlock.Grant{}, nil
		}
		return s.reenter(ctx, h, r)
	}
	s.mu.Unlock()
	conn, err := s.b.pool.Acquire(ctx)
	if err != nil {
		return dlock.Grant{}, wrap("acquire", err)
	}
	var (
		fence  int64
		pid    int32
		remain int64
	)
	// As in the lease mode, the holder's TTL is read only for an attempt
	// made while a waiter of this Backend is subscribed to the key.
	stmt := s.b.stmts.sessionLock[b2i(s.b.lis.waiting(r.Key))]
	start := time.Now()
	if err := conn.QueryRow(ctx, stmt, r.Key, idleTimeout(r.TTL), r.Token, r.TTL.Microseconds()).Scan(&fence, &pid, nil, &remain); err != nil {
		s.abort(conn, r)
		return dlock.Grant{}, wrap("acquire", err)
	}
	if fence == 0 {
		conn.Release()
		return dlock.Grant{HolderTTL: time.Duration(remain) * time.Microsecond}, nil
	}
	h := &session{conn: conn, key: r.Key, token: r.Token, fence: uint64(fence), count: 1, pid: pid, lastOK: start, ttl: r.TTL,
		slot: make(chan struct{}, 1)}
	s.mu.Lock()
	s.held[r.Key] = h
	s.mu.Unlock()
	return dlock.Grant{OK: true, Fence: h.fence, Count: 1}, nil
}

// reenter counts one more hold of h for r once a renewal started after
// the call has set the deadline to at least now + r.TTL, as every grant
// does. A hold that ended, or whose renewal finds it lost, is not
// granted; another renewal error is returned.
func (s *SessionBackend) reenter(ctx context.Context, h *session, r dlock.Request) (dlock.Grant, error) {
	if !h.alive() {
		return dlock.Grant{}, nil
	}
	if err := h.renew(ctx, s.b.stmts.sessionPing, r.TTL); err != nil {
		if errors.Is(err, dlock.ErrNotHeld) || !h.alive() {
			return dlock.Grant{}, nil
		}
		return dlock.Grant{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[r.Key] != h || !h.alive() {
		return dlock.Grant{}, nil // released or lost meanwhile
	}
	h.count++
	return dlock.Grant{OK: true, Fence: h.fence, Count: h.count}, nil
}

// abort cleans up after an attempt that failed on conn: it closes conn,
// ending the session and any lock it took (a session lock outlives a
// rolled-back transaction), and frees the row a lost reply may have
// granted when the token is the attempt's own (not Reentrant); a grant
// committed after that expires at its TTL.
func (s *SessionBackend) abort(conn *pgxpool.Conn, r dlock.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	_ = conn.Conn().Close(ctx)
	conn.Release()
	if !r.Reentrant {
		_, _ = s.b.pool.Exec(ctx, s.b.stmts.sessionAbort, r.Key, r.Token)
	}
}

// hold returns the live session of r, or an error matching
// dlock.ErrNotHeld.
func (s *SessionBackend) hold(op string, r dlock.Request) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.held[r.Key]
	if h == nil || h.token != r.Token || (r.Fence != 0 && h.fence != r.Fence) {
		return nil, fmt.Errorf("pglock: %s: %w", op, dlock.ErrNotHeld)
	}
	return h, nil
}

// Refresh checks that the lock's session is alive and still the same
// server process, sets the session's idle timeout to r.TTL and moves the
// row's deadline to greatest(expires, now() + r.TTL), in one statement.
// The session lock lives as long as the session; the server ends a session idle for its
// timeout, and the backend closes one whose renewal has not succeeded
// within the TTL after the last success, so no lock outlives its lease by
// more than a TTL. The check runs on its own: a caller whose context ends
// returns at once while the check goes on (cutting the statement short
// would close the connection and end the session). A session that ended
// is reported with its error, not ErrNotHeld (whether the server already
// noticed is unknown: the lease ends when it could have expired); a
// changed server process, or a row no longer the grant's, with an error
// matching dlock.ErrNotHeld.
func (s *SessionBackend) Refresh(ctx context.Context, r dlock.Request) error {
	if err := s.b.enterKey(ctx, r.Key); err != nil {
		return err
	}
	if err := checkSessionTTL(r.TTL); err != nil {
		return err
	}
	h, err := s.hold("refresh", r)
	if err != nil {
		return err
	}
	return h.renew(ctx, s.b.stmts.sessionPing, r.TTL)
}

// RefreshMany refreshes every request as Refresh does, each on its own
// hold's connection and all at once, so that a renewal held up on one
// session does not hold up the others. The result has one entry per
// request, as Refresh returns it.
func (s *SessionBackend) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() { errs[i] = s.Refresh(ctx, r) })
	}
	wg.Wait()
	return errs
}

// renew runs one renewal with a TTL of at least ttl, starting after the
// call (or joins the one due to start), and waits for it or for ctx.
func (h *session) renew(ctx context.Context, stmt string, ttl time.Duration) error {
	h.mu.Lock()
	if h.dead != nil {
		h.mu.Unlock()
		return fmt.Errorf("pglock: refresh: the session ended: %w", h.dead)
	}
	// A renewal due to start has not read h.ttl yet (ping clears
	// inflight when it does): it renews to the raised TTL.
	h.ttl = max(h.ttl, ttl)
	r := h.inflight
	if r == nil {
		r = &renewal{done: make(chan struct{})}
		h.inflight = r
		go h.ping(stmt, h.lastOK.Add(h.ttl), r)
	}
	h.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return wrap("refresh", ctx.Err())
	}
}

// ping checks the session, bounded by deadline (the lease's validity,
// moved on by a renewal that succeeds meanwhile): it waits for the
// statement running on conn, then runs its own.
func (h *session) ping(stmt string, deadline time.Time, r *renewal) {
	defer close(r.done)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if !h.take(ctx) {
		h.mu.Lock()
		if h.inflight == r {
			h.inflight = nil
		}
		h.mu.Unlock()
		r.err = fmt.Errorf("pglock: refresh: the session was busy until the lease's deadline: %w", ctx.Err())
		return
	}
	defer h.give()
	h.mu.Lock()
	if h.inflight == r {
		h.inflight = nil
	}
	dead, ttl := h.dead, h.ttl
	deadline = h.lastOK.Add(ttl)
	h.mu.Unlock()
	if dead != nil { // released, or failed, while this renewal waited
		r.err = fmt.Errorf("pglock: refresh: the session ended: %w", dead)
		return
	}
	ctx, cancel = context.WithDeadline(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	var (
		pid   int32
		found bool
	)
	err := h.conn.QueryRow(ctx, stmt, idleTimeout(ttl), h.key, h.token, int64(h.fence), ttl.Microseconds()).Scan(&pid, nil, &found)
	switch {
	case err != nil:
		h.fail(err)
		r.err = wrap("refresh", err)
	case pid != h.pid:
		r.err = fmt.Errorf("pglock: refresh: %w: the connection moved from server process %d to %d; session mode needs a session of its own (a transaction-pooling proxy is in the way)", dlock.ErrNotHeld, h.pid, pid)
	case !found:
		r.err = fmt.Errorf("pglock: refresh: %w: the lock's row was freed (ForceRelease) or taken over after its deadline", dlock.ErrNotHeld)
	default:
		h.mu.Lock()
		h.lastOK = start
		h.mu.Unlock()
	}
}

// idleTimeout is a TTL as a value of idle_session_timeout (milliseconds,
// rounded up).
func idleTimeout(ttl time.Duration) string {
	return strconv.FormatInt(int64((ttl+time.Millisecond-1)/time.Millisecond), 10)
}

// Release gives up one hold; the last frees the row, unlocks the session
// lock, wakes the oldest live waiter (one statement) and returns the
// connection to the pool (a session that already ended has its row freed
// on another connection, and the release reports dlock.ErrNotHeld). When
// r.Token does not hold the lock it returns an error matching
// dlock.ErrNotHeld and changes nothing. When a renewal keeps the
// connection until ctx ends, it returns ctx's error and the release
// finishes in the background (see "Session mode" in the package
// documentation).
func (s *SessionBackend) Release(ctx context.Context, r dlock.Request) error {
	if err := s.b.enterKey(ctx, r.Key); err != nil {
		return err
	}
	s.mu.Lock()
	h := s.held[r.Key]
	if h == nil || h.token != r.Token || (r.Fence != 0 && h.fence != r.Fence) {
		s.mu.Unlock()
		return fmt.Errorf("pglock: release: %w", dlock.ErrNotHeld)
	}
	if h.count > 1 {
		h.count--
		s.mu.Unlock()
		return nil
	}
	delete(s.held, r.Key)
	s.mu.Unlock()
	return s.unlock(ctx, h, true)
}

// unlock releases the session lock and the connection. A release
// (clean) also frees the grant's row, ending the lock-delay, even when
// the session has already ended; a hold given up after a loss leaves the
// row to its deadline, which its holder may still believe in. When a
// statement (a renewal) keeps the connection past ctx, unlock returns
// ctx's error and finishes in the background (finish).
func (s *SessionBackend) unlock(ctx context.Context, h *session, clean bool) error {
	h.mu.Lock()
	h.onEnd = nil // a hold given back is not lost
	h.mu.Unlock()
	if !h.take(ctx) {
		s.gave.Add(1)
		go func() {
			defer s.gave.Done()
			s.finish(h, clean)
		}()
		return fmt.Errorf("pglock: release: %w (the connection was busy; the lock is given back in the background)", ctx.Err())
	}
	defer h.give()
	return s.unlockTaken(ctx, h, clean)
}

// finish is unlock for a caller whose context ended while a statement
// kept the connection: it waits for the statement up to abandonTimeout,
// then ends the session from another connection (pg_terminate_backend,
// which frees the session lock at once, and makes the statement fail),
// and gives the lock back: a release frees the row, trying until the
// grant's deadline.
func (s *SessionBackend) finish(h *session, clean bool) {
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	if !h.take(ctx) {
		kctx, kcancel := context.WithTimeout(context.Background(), abandonTimeout)
		_, _ = s.b.pool.Exec(kctx, s.b.stmts.sessionKill, h.key, h.pid)
		kcancel()
		h.slot <- struct{}{} // the statement ends by the lease's deadline at the latest
	}
	defer h.give()
	// Freeing the row can wait for whatever held up the renewal (a row
	// lock): it is worth trying until the grant's deadline, when the row
	// frees itself.
	h.mu.Lock()
	deadline := h.lastOK.Add(h.ttl)
	h.mu.Unlock()
	uctx, ucancel := context.WithDeadline(context.Background(), deadline)
	defer ucancel()
	_ = s.unlockTaken(uctx, h, clean)
}

// unlockTaken is unlock with the connection taken.
func (s *SessionBackend) unlockTaken(ctx context.Context, h *session, clean bool) error {
	h.mu.Lock()
	dead := h.dead
	h.mu.Unlock()
	if dead != nil {
		err := fmt.Errorf("pglock: release: %w: the session ended, and with it the lock: %v", dlock.ErrNotHeld, dead)
		h.setDead(errReleased)
		h.conn.Release()
		if clean {
			s.free(ctx, h)
		}
		return err
	}
	var (
		ok  bool
		err error
	)
	if clean {
		err = h.conn.QueryRow(ctx, s.b.stmts.sessionUnlock, h.key, h.token, int64(h.fence)).Scan(&ok, nil, nil)
	} else {
		err = h.conn.QueryRow(ctx, s.b.stmts.sessionGiveUp, h.key).Scan(&ok, nil)
	}
	if err != nil {
		// Closing the connection ends the session: the server releases
		// the lock.
		h.fail(err)
		h.setDead(errReleased)
		h.conn.Release()
		if clean {
			s.free(ctx, h)
		}
		if sessionEnded(err) {
			return fmt.Errorf("pglock: release: %w: the session ended, and with it the lock: %v", dlock.ErrNotHeld, err)
		}
		return wrap("release", err)
	}
	h.setDead(errReleased)
	h.conn.Release()
	if !ok {
		return fmt.Errorf("pglock: release: %w: the session did not hold the lock (a transaction-pooling proxy is in the way?)", dlock.ErrNotHeld)
	}
	return nil
}

func (h *session) setDead(err error) {
	h.mu.Lock()
	h.dead = err
	h.mu.Unlock()
}

// free frees h's row on another connection (the lease mode's release of
// a single hold: it also wakes the oldest live waiter), after h's session
// ended: the holder gave the lock up, so no lock-delay is needed. Within
// ctx; if it fails the row expires at its deadline.
func (s *SessionBackend) free(ctx context.Context, h *session) {
	_, _ = s.b.pool.Exec(ctx, s.b.stmts.release[1], h.key, h.token, int64(h.fence))
}

// fail records that the connection failed and closes it, ending the
// session; when the server ended the session (or the connection was
// reset), the lock is certainly released and the loss is reported at
// once. Caller has taken the connection (take).
func (h *session) fail(err error) {
	h.mu.Lock()
	if h.dead != nil {
		h.mu.Unlock()
		return
	}
	h.dead = err
	var onEnd []func(error)
	if sessionEnded(err) {
		onEnd, h.onEnd = h.onEnd, nil
	}
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = h.conn.Conn().Close(ctx)
	cancel()
	for _, fn := range onEnd {
		go fn(fmt.Errorf("%w: the lock's session ended: %v", dlock.ErrLost, err))
	}
}

// sessionEnded reports whether err says the server ended the session (or
// the connection is gone), rather than a timeout that leaves it unknown.
func sessionEnded(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "57P") || pe.Severity == "FATAL"
	}
	return !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

func (h *session) alive() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dead == nil
}

// NotifyLoss calls fn once when r's session is found ended by the server
// (terminated, restarted, connection reset), at the renewal or release
// that finds it. A session cut off by a timeout is not reported here: the
// lease then ends when it could have expired.
//
// When the last registration of a hold stops while the hold is still
// here (the Client gave the lease up without releasing it, as after a
// loss), the hold is given up: its session lock is unlocked in the
// background, within a second, or its session closed. Its row is left
// to the grant's deadline: the lease's holder was not released and may
// still believe it holds the lock until then.
func (s *SessionBackend) NotifyLoss(r dlock.Request, fn func(cause error)) (stop func()) {
	h, err := s.hold("notify", r)
	if err != nil {
		return func() {}
	}
	s.mu.Lock()
	h.regs++
	s.mu.Unlock()
	// Flags, not a sync.Once: fn's caller may call stop from inside fn.
	var fired, stopped atomic.Bool
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onEnd = append(h.onEnd, func(cause error) {
		if !stopped.Load() && fired.CompareAndSwap(false, true) {
			fn(cause)
		}
	})
	return func() {
		if stopped.CompareAndSwap(false, true) {
			s.unregister(h)
		}
	}
}

// unregister drops one loss registration of h; the last one gives h up if
// it is still held (not released meanwhile).
func (s *SessionBackend) unregister(h *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.regs--; h.regs > 0 || s.held[h.key] != h {
		return
	}
	delete(s.held, h.key)
	s.gave.Add(1)
	go func() {
		defer s.gave.Done()
		ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
		defer cancel()
		_ = s.unlock(ctx, h, false)
	}()
}

// Inspect returns whether the lock is held, by a session or by the
// lock-delay of a grant whose session ended without a release; its fence,
// owner and remaining TTL from the key's row (from the holder session's
// application_name when the row has expired: an owner longer than the
// name's 63 bytes allow is cut, TTL 0); the hold count when the lock is
// held through this SessionBackend; and the number of live waiters.
func (s *SessionBackend) Inspect(ctx context.Context, key string) (dlock.Info, error) {
	if err := s.b.enterKey(ctx, key); err != nil {
		return dlock.Info{}, err
	}
	var (
		pid     *int32
		app     string
		waiters int64
		token   *string
		fence   *int64
		remain  *int64
	)
	if err := s.b.pool.QueryRow(ctx, s.b.stmts.sessionInspect, key).Scan(&pid, &app, &waiters, &token, &fence, &remain); err != nil {
		return dlock.Info{}, wrap("inspect", err)
	}
	info := dlock.Info{Key: key, Held: pid != nil || token != nil, Waiters: int(waiters)}
	switch {
	case token != nil:
		info.Owner, info.Fence, info.TTL = *token, uint64(*fence), time.Duration(*remain)*time.Microsecond
	case !info.Held:
		return info, nil
	default:
		// "dlock FENCE TOKEN", set by the holder's session at the grant.
		if f := strings.SplitN(app, " ", 3); len(f) == 3 && f[0] == "dlock" {
			info.Fence, _ = strconv.ParseUint(f[1], 10, 64)
			info.Owner = f[2]
		} else {
			info.Owner = fmt.Sprintf("server process %d", *pid)
		}
	}
	s.mu.Lock()
	if h := s.held[key]; h != nil && h.fence == info.Fence {
		info.Owner, info.Count = h.token, h.count
	}
	s.mu.Unlock()
	return info, nil
}

// ForceRelease frees the lock at once: it frees the key's row (ending a
// lock-delay), ends the session holding the lock (pg_terminate_backend;
// the server then releases the lock and the holder learns of the loss at
// its next renewal) and wakes the oldest live waiter. Held is false when
// the lock was free.
func (s *SessionBackend) ForceRelease(ctx context.Context, key string) (dlock.Info, error) {
	info, err := s.Inspect(ctx, key)
	if err != nil || !info.Held {
		return info, err
	}
	if _, err := s.b.pool.Exec(ctx, s.b.stmts.sessionTerminate, key); err != nil {
		return dlock.Info{}, wrap("force release", err)
	}
	info.Waiters = -1
	return info, nil
}

// Subscribe is Backend.Subscribe: releases wake the oldest live waiter.
func (s *SessionBackend) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	return s.b.Subscribe(ctx, key)
}

// Close ends the sessions of locks still held (the server releases them;
// their rows keep the locks until their deadlines) and closes the
// listener. It does not close the pool.
func (s *SessionBackend) Close() error {
	s.mu.Lock()
	held := s.held
	s.held = make(map[string]*session)
	s.mu.Unlock()
	s.gave.Wait()
	for _, h := range held {
		h.slot <- struct{}{} // a renewal running ends by the lease's deadline
		h.mu.Lock()
		dead := h.dead
		h.mu.Unlock()
		if dead == nil {
			h.fail(errClosed)
		}
		if dead != errReleased {
			h.conn.Release()
		}
		h.give()
	}
	return s.b.Close()
}
