// Package pglock is a dlock backend on PostgreSQL (pgx v5): locks are rows
// of a lease table, so it works wherever a pool of short transactions
// does, including through a transaction-pooling proxy. A session mode
// (NewSession) also holds each lock as a session advisory lock, lost with
// the connection: the holder learns of a dropped connection at its next
// statement, and no one else is granted the lock before the dropped
// grant's deadline.
//
//	pool, _ := pgxpool.New(ctx, "postgres://app@db/app")
//	locks := dlock.New(pglock.New(pool), dlock.WithTTL(10*time.Second))
//
// # Tables
//
// The backend keeps its state in one schema (DefaultSchema "dlock", see
// WithSchema), which it creates on first use, marked with a comment:
//
//	locks   (key text PRIMARY KEY, token text, fence bigint, count integer, expires timestamptz,
//	         wake_until timestamptz)
//	waiters (id bigint identity PRIMARY KEY, key text, channel text, tag bigint, expires timestamptz)
//	fence   sequence
//	wake(k text) boolean   function: notifies the oldest live waiter of k
//
// A schema of that name without the marker, or whose relations and
// functions differ from the list above (an extra column, a missing index),
// is refused with an error matching dlock.ErrWrongType and never written
// to. So is a role that lacks the privileges the statements need: the
// error names the role and the grants. A schema made by the first release
// (without wake_until and wake) is upgraded in place (ADD COLUMN, CREATE
// FUNCTION; a role that does not own it gets an error saying so); clients
// of that release keep working next to this one. Creation and upgrade are
// serialized between concurrent backends by a transaction-scoped advisory
// lock; within a Backend, one call sets up while the others wait for it
// within their own contexts.
//
// Keys are stored as text, which holds neither NUL bytes nor invalid
// UTF-8: such a key (dlock.ValidateKey accepts both) is refused before any
// statement with an error matching dlock.ErrInvalidKey that names the
// problem.
//
// # Statements
//
// Every operation is one statement in its own transaction (a TryAcquire at
// most two, see below), on the server's clock (now(), the statement's
// start). A statement that fails because its pooled connection broke
// (after a server restart every idle connection of the pool fails once,
// and the pool discards it) is run again where that is safe, up to one
// run more than the pool's MaxConns, which reaches a new connection; a
// failed dial is not retried. Safe are Refresh, Inspect and Subscribe
// always, TryAcquire and Release for a request with a token of its own (a
// TryAcquire first gives back the grant the lost attempt may have made),
// never a reentrant one, whose count could change twice.
//
//   - TryAcquire: INSERT ... ON CONFLICT (key) DO UPDATE. A missing or
//     free row (expires <= now(): released or expired) is granted with
//     nextval('fence'), count 1 and expires now() + TTL. A live row of the
//     same token is re-entered only when Request.Reentrant: count + 1, the
//     same fence, expires = greatest(expires, now() + TTL). Otherwise
//     nothing changes. An attempt made while a waiter of the same Backend
//     is subscribed to the key also returns the holder's remaining TTL
//     (the bound of that waiter's wait); the first attempt of an
//     acquisition, which the Client follows with a subscription and an
//     immediate retry, runs the INSERT alone and reports the holder's TTL
//     as unknown (0): the second branch costs a grant a tenth of its time
//     or more. A key whose lock this Backend freed last, with no waiter
//     about, is tried first with an UPDATE of the free row alone (token, a
//     fence from nextval, count 1, expires; where expires <= now()): the
//     upsert's conflict path locks the row before it updates it, which
//     costs a grant about a tenth more. When that finds no free row (the
//     key was taken or swept since), the upsert runs: two statements, and
//     the key is no longer tried that way. Fences drawn by the UPDATE
//     follow the grant order as well: a concurrent change of the row makes
//     the server compute the new version again from the latest one.
//   - Refresh (and RefreshMany, one UPDATE ... FROM unnest(...) for a
//     whole batch): expires = greatest(expires, now() + TTL) where key,
//     token and (when the request carries one) fence match and the row has
//     not expired. Deadlines never move back.
//   - Release: where key, token and fence match on a live row, count - 1;
//     the last hold frees the row (empty token, expires now()) and, in the
//     same statement, when the row's wake_until has not passed, calls
//     wake, which notifies the oldest live waiter of the key. No match:
//     dlock.ErrNotHeld, nothing changed; but a run after one that may
//     have reached the server (its connection broke after sending) and
//     that finds no match returns nil: the earlier run freed the lock,
//     and its reply was lost. A release with no waiter about
//     is one row update: it does not read the waiters table (a subquery
//     on it, even one never run, costs a release about a quarter of its
//     time).
//
// Each statement comes in variants for what a request decides (fence
// compared or not, re-entry allowed or not, holder's TTL reported or not),
// so that the server plans it once per session and reuses the plan; a
// parameter tested in SQL would have it planned on every execution, at
// several times the cost of the execution.
//
// A TryAcquire whose context ends while the statement runs, or whose
// last run lost its connection, may still have committed a grant. For a
// request with a token of its own (not Reentrant) the backend then frees
// that token's lock, with a fresh one-second context, before it returns
// the error; a grant committed after that clean-up expires at its TTL. A
// hold count raised by a re-entry whose reply was lost lives only as long
// as the row's deadline: once no hold is renewed, the row expires at most
// one TTL after the last renewal and the lock is free.
//
// # Fences
//
// Fences come from the sequence "fence": nextval never returns a value
// twice, across keys and server restarts (the sequence is WAL-logged
// ahead of use; with synchronous_commit on, a grant whose commit was
// acknowledged survives a crash). A free row is taken over with a value
// drawn after the row is locked, so grants of a key draw their fences in
// the order they are granted, and fences strictly increase per key without
// relying on any clock. Release does not delete the row: it stays, free,
// until the sweeper deletes it a sweep interval (at least 10s) later. A
// key without a row is granted with a value drawn just before the
// insertion; it could be lower than the key's last fence only if that
// statement stalled inside the server, between drawing and inserting, for
// longer than the row stayed free and was swept. Restoring the database
// from an older backup can move the sequence back; set it above the
// highest fence handed out before (setval) after such a restore.
//
// Expiry compares the row's expires with now() on the server alone: the
// clients' clocks are never compared with it. A client's Lease.Expires is
// computed from the time it sent the request, before the server's now(),
// so it is never later than the server's deadline.
//
// When the protected data lives in the same database, Guard checks the
// lease's row inside the writer's transaction and locks it FOR SHARE until
// the transaction ends: the write commits only while the lease holds the
// lock (see the fenced-write example). Inside that transaction now() is
// the transaction's start, so Guard compares the deadline with
// clock_timestamp() instead: the time the row is checked, after any wait
// for a lock on it.
//
// # Waiting
//
// A Backend keeps one session of its own, LISTENing on a channel unique to
// it (WithListenConfig, WithoutListen), dialed by the first Subscribe:
// other Subscribes wait for that dial within their own contexts, and
// nothing else waits for it. Subscribe inserts a row into
// waiters naming that channel and a tag and, in the same statement, sets
// the key's wake_until in locks to the waiter's expiry (inserting a free
// row, fence 0, for a key without one; a mark that already lasts two
// thirds of the waiter TTL is left alone, so that a crowd of waiters does
// not queue on the row every grant and release updates); a release (or
// ForceRelease) sends pg_notify to the channel of the oldest live waiter
// of the key, with "TAG:KEY" as payload, in the statement that frees the
// lock. The listener wakes that waiter alone: one waiter per release, not
// a herd. A Subscribe that commits before a release locks the row is seen
// by that release (wake_until is read on the row's latest version); one
// that commits later is followed by the Client's retry, which finds the
// lock free. A waiter that leaves deletes its row before it returns (a row
// left to the new holder would take its next release's wake-up), but waits
// for the server at most MinTTL: the Client stops a subscription before
// Acquire returns, and a server that does not answer must not hold the
// grant up; the delete then goes on in the background. A waiter that was
// woken after it had left passes the wake-up on to the next live waiter,
// if the lock is still free.
//
// The listener renews its waiters' rows, and their keys' wake_until, every
// waiter TTL/3 on its own session (WithWaiterTTL), so the rows of a
// process that died, or whose session broke, stop being chosen within the
// waiter TTL. A broken session is reconnected (pausing 10ms, doubling up
// to 1s, until Close); meanwhile Subscribe fails and waiters fall back to
// the holder's TTL, and once back every local waiter is woken once. A lost
// notification therefore costs a waiter at most the holder's remaining
// TTL.
//
// There is no server-side FIFO queue (dlock.Waiter): WithFIFO is refused
// by the Client. Waiters are woken oldest first, but a new TryAcquire may
// still take a lock before the woken waiter retries.
//
// # Leftovers
//
// Released and expired rows are free locks (every statement compares
// expires with now()), and each Backend deletes lock and waiter rows that
// have been free for more than a sweep interval (lock rows also no
// longer marked for a waiter for that long), every sweep interval
// (WithSweepInterval, default 30s): no row outlives its lock, or its last
// waiter, by more than two sweep intervals while some Backend runs.
//
// # Transaction pooling
//
// Nothing but the LISTEN session depends on a session: no advisory locks,
// no session settings, no temporary tables. Behind PgBouncer in
// transaction mode, configure the pool without prepared statements
// (pgx.QueryExecModeExec or QueryExecModeSimpleProtocol) and point
// WithListenConfig at the server directly, or use WithoutListen.
//
// # Session mode
//
// NewSession returns a SessionBackend that holds each lock as a session
// advisory lock (pg_try_advisory_lock on a 64-bit hash of the schema and
// the key) on a pooled connection it keeps out of the pool while the lock
// is held, together with the key's row in locks, which records the
// grant's deadline. The grant is one statement: once the advisory lock is
// taken, the row is taken over as a lease-mode grant takes a free row
// (token, a fence from the sequence drawn after the row is locked, count
// 1, expires now() + TTL), but only if the row is free; a row still live
// belongs to an earlier grant whose session ended without a release, and
// the statement unlocks the advisory lock again: the attempt is not
// granted (and reports the row's remaining TTL, see below). Each renewal, a round trip on
// the holder's session that checks the session is alive, moves the row's
// deadline to greatest(expires, now() + TTL) in the same statement; a
// release frees the row (expires now()), then unlocks the advisory lock
// and wakes the oldest live waiter, in one statement.
//
// This is a lock-delay (Chubby's): when a session ends without a release
// (the holder's process was killed, its connection reset by a proxy or a
// network fault, the server restarted, an idle timeout), the server frees
// the advisory lock at once, but the holder may still believe it holds
// the lock until the Expires of its last renewal, which is never later
// than the row's deadline (both come from the same TTL; the Client counts
// from the request's start, the server from the statement's). No other
// owner is granted before that deadline: another acquirer sees it as
// held, with the remaining TTL as the bound of its wait, and takes it at
// the next attempt after the deadline. What a user sees: a lock whose
// holder died is taken over up to a TTL later (as in the lease mode),
// not at once; a released lock is taken over at once. The row survives a
// server restart (it is a logged table), so the delay holds across one.
// A lease that the Client gives up after a loss (its registration
// stopped, dlock.LossNotifier) has its advisory lock unlocked in the
// background but keeps its row until the deadline: it was not released.
// A Release after the session ended frees the row all the same (the
// holder says it is done), and reports dlock.ErrNotHeld.
//
// The cost: the grant, each renewal and the release write the row (the
// same one-row writes as the lease mode's), where the advisory lock alone
// wrote nothing; the statements are combined, so each operation is still
// one round trip. A release wakes a waiter only when the row is marked
// for one (as in the lease mode), and the grant reads the holder's
// remaining TTL only while a waiter of the Backend is subscribed to the
// key. Measured on loopback with the machine's two cores loaded: an
// uncontended grant and release, the statements alone on one
// connection, take 1.3 times as long as without the row (2000 cycles,
// median); through dlock.Client (BenchmarkS1, median of six runs) the
// session mode went from 0.94 to 0.67 times the rate of a bare
// lease-table lock (one upsert, one delete), the lease mode measuring
// 0.90 in the same runs.
//
// The lock ends with the session or with its row. The session ends on
// release, when the connection drops, when an administrator ends it, and
// when it sits idle for the lease's TTL (the grant sets the session's
// idle_session_timeout to the TTL; each renewal resets it). The session
// mode therefore needs PostgreSQL 14 or later, and a TTL of at most
// MaxSessionTTL (2^31-1 ms, about 24.9 days, the setting's largest
// value): SessionBackend.MaxTTL reports it (dlock.TTLLimiter), and a
// longer TTL is refused with an error matching dlock.ErrInvalidTTL. A renewal
// that does not succeed within the TTL after the last success closes the
// connection. A session the server ended is reported at once through
// dlock.LossNotifier, at the renewal that finds it; a renewal that timed
// out leaves it unknown whether the server noticed, and the lease ends
// when it could have expired. A renewal that finds the row no longer the
// grant's (freed by ForceRelease, or taken by a lease-mode client after
// its deadline) fails with an error matching dlock.ErrNotHeld.
//
// One statement at a time runs on a hold's connection, and no call waits
// for it past its own context: a renewal runs on its own goroutine (the
// caller whose context ends returns while it goes on; cutting it short
// would close the connection and end the session), and a Refresh or
// Release that finds the connection busy waits for it within its context.
// RefreshMany renews each hold as Refresh does, all at once, so that a
// renewal held up on one session does not hold up another's.
// A Release whose context ends first returns the context's error and
// finishes in the background: it waits up to a second more for the
// statement, then ends the holder's session from another connection
// (pg_terminate_backend, which frees the session lock even while the
// statement is held up inside the server), and frees the row, trying
// until the grant's deadline.
//
// The rows are those of the lease mode: in one schema the two modes
// exclude each other on a key. The sweeper deletes them as it deletes
// the lease mode's. An attempt whose statement fails closes its
// connection (a session lock outlives a rolled-back transaction) and,
// for a request with a token of its own, frees the row the lost reply may
// have granted; a grant committed after that clean-up keeps the key
// until its deadline.
//
// The grant also sets the session's application_name to "dlock FENCE
// TOKEN" (cut at 63 bytes; the release clears it and the idle timeout
// before the connection goes back to the pool). Inspect reads the
// holder's owner, fence and remaining TTL from the row (from the holder
// session's application_name in pg_stat_activity when the row has
// expired), and reports a lock in its lock-delay as held; ForceRelease
// frees the row and ends the holder's session (pg_terminate_backend).
//
// A session lock cannot be shared between processes: re-entry
// (Request.Reentrant) works within one SessionBackend only, and, like
// every grant, first renews the deadline to at least now + its TTL (one
// round trip, joined with a renewal that has not started yet). Each held
// lock keeps one connection, so the pool's size bounds the locks held at
// once. The connection must reach the server directly or through session
// pooling: behind a transaction-pooling proxy the next renewal finds
// another server process and the release finds no lock, both reported as
// errors matching dlock.ErrNotHeld that say so. Waiting works as in the
// lease mode (the waiters table and a LISTEN session); expiry by the idle
// timeout, and the end of a lock-delay, wake no waiter: each waiter
// retries when the holder's remaining TTL, reported by its last attempt,
// has passed.
//
// # Minimum TTL
//
// MinTTL (100ms) is the shortest TTL the backend accepts. The watchdog
// renews every TTL/3 (33ms at the minimum) and retries a failed renewal
// within the lease's validity. A renewal is one UPDATE by primary key (in
// the session mode, in the statement that checks the session):
// 3000 renewals on loopback, with the machine's two cores loaded at a
// load average of 6.7, took 0.11ms median, 2.3ms at the 99th percentile,
// 19ms at the 99.9th and 21ms at most; a 33ms period covers the slowest
// of them with room for a retry. Across a network add a few round trips
// and choose TTLs well above the floor.
package pglock
