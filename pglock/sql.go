package pglock

import "strings"

// The statements, with {s} standing for the quoted schema. Every one is a
// single statement in its own implicit transaction, so they work through
// transaction pooling. Times come from the server's clock: now() is the
// start of the statement. TTLs are passed in microseconds.
const (
	// $1 key, $2 token, $3 TTL µs; {reenter} is whether the holder's token
	// re-enters (Request.Reentrant). The grant of sqlAcquire and
	// sqlAcquireTTL, without its RETURNING list.
	//
	// A free row (released or expired) is taken over with a fence drawn
	// in the SET list, that is after the row is locked: grants of one key
	// draw their fences in the order they are granted. The fence drawn in
	// VALUES serves only a key without a row.
	sqlUpsert = `INSERT INTO {s}.locks AS l (key, token, fence, count, expires)
  VALUES ($1, $2, nextval('{s}.fence'), 1, now() + $3::bigint * interval '1 microsecond')
  ON CONFLICT (key) DO UPDATE SET
    token = excluded.token,
    fence = CASE WHEN l.expires > now() THEN l.fence ELSE nextval('{s}.fence') END,
    count = CASE WHEN l.expires > now() THEN l.count + 1 ELSE 1 END,
    expires = CASE WHEN l.expires > now() THEN greatest(l.expires, excluded.expires) ELSE excluded.expires END
  WHERE l.expires <= now() OR {reenter}`

	// sqlUpsert reporting one row: granted, fence, count, 0. No row: not
	// granted.
	sqlAcquire = sqlUpsert + `
  RETURNING true, l.fence, l.count, 0::bigint`

	// $1 key, $2 token, $3 TTL µs: sqlAcquire for a row that is free
	// (released or expired), an UPDATE alone. One row: granted, fence,
	// count, 0. No row: the key has no free row (held, or none at all).
	// The fence is drawn when the new row version is computed; a
	// concurrent change of the row makes the server compute it again
	// from the latest version, so fences still follow the grant order.
	sqlAcquireFree = `UPDATE {s}.locks l SET token = $2, fence = nextval('{s}.fence'), count = 1,
    expires = now() + $3::bigint * interval '1 microsecond'
  WHERE key = $1 AND expires <= now()
  RETURNING true, l.fence, l.count, 0::bigint`

	// sqlAcquireTTL is sqlAcquire that also reports, when not granted,
	// the holder's remaining µs: one row, granted, fence, count,
	// remaining. No row: held by another owner whose row this statement's
	// snapshot does not see. The second branch costs the grant a
	// noticeable share of its time, so it is used only for attempts that
	// need the answer (see TryAcquire).
	sqlAcquireTTL = `WITH up AS (
` + sqlUpsert + `
  RETURNING l.fence, l.count
)
SELECT true, fence, count, 0::bigint FROM up
UNION ALL
SELECT false, 0::bigint, 0, (extract(epoch FROM l.expires - now()) * 1e6)::bigint
  FROM {s}.locks l WHERE l.key = $1 AND NOT EXISTS (SELECT 1 FROM up)`

	// $1 key, $2 token, $3 fence, $4 TTL µs; {fence} compares the fence,
	// or accepts any when the request has none. One row updated: held.
	sqlRefresh = `UPDATE {s}.locks SET expires = greatest(expires, now() + $4::bigint * interval '1 microsecond')
WHERE key = $1 AND token = $2 AND {fence} AND expires > now()`

	// $1 keys, $2 tokens, $3 fences, $4 TTLs µs. Returns the 1-based
	// indexes of the requests that still held their lock.
	sqlRefreshMany = `UPDATE {s}.locks l SET expires = greatest(l.expires, now() + r.ttl * interval '1 microsecond')
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS r(key, token, fence, ttl, i)
WHERE l.key = r.key AND l.token = r.token AND (r.fence = 0 OR l.fence = r.fence) AND l.expires > now()
RETURNING r.i`

	// $1 key, $2 token, $3 fence ({fence} as in sqlRefresh). One row when
	// a live hold was given up (nothing matches: no row, nothing changes):
	// 0 still held (count > 0), 1 freed with no waiter about, 2 freed and
	// no live waiter found, 3 freed and a waiter woken. The last hold
	// frees the row (token '', expires now(): the row keeps the key's
	// last fence until the sweeper deletes it) and, when a waiter may be
	// queued (wake_until > now()), wakes the oldest live one through the
	// function wake. Only then does the statement read the waiters table:
	// a release without waiters costs one row update.
	sqlRelease = `UPDATE {s}.locks SET count = count - 1,
    token = CASE WHEN count > 1 THEN token ELSE '' END,
    expires = CASE WHEN count > 1 THEN expires ELSE now() END
  WHERE key = $1 AND token = $2 AND {fence} AND expires > now()
  RETURNING CASE WHEN count > 0 THEN 0 WHEN wake_until <= now() THEN 1 ELSE 2 + {s}.wake($1)::int END`

	// sqlWake notifies the oldest live waiter of $1, if any (as the
	// function wake does), for the statements that always wake one:
	// ForceRelease and the session mode's unlock and termination.
	sqlWake = `SELECT pg_notify(w.channel, w.tag || ':' || w.key) FROM {s}.waiters w
    WHERE w.key = $1 AND w.expires > now() ORDER BY w.id LIMIT 1`

	// $1 key. One row whether held or not: token, fence, count, remaining
	// µs (NULL when free), live waiters.
	sqlInspect = `SELECT l.token, l.fence, l.count, (extract(epoch FROM l.expires - now()) * 1e6)::bigint,
  (SELECT count(*) FROM {s}.waiters w WHERE w.key = $1 AND w.expires > now())
FROM (SELECT 1) one LEFT JOIN {s}.locks l ON l.key = $1 AND l.expires > now()`

	// $1 key. The live lock freed, if any (as by a release).
	sqlForceRelease = `WITH old AS (
  SELECT key, token, fence, count, expires FROM {s}.locks WHERE key = $1 AND expires > now() FOR UPDATE
), u AS (
  UPDATE {s}.locks l SET token = '', count = 0, expires = now() FROM old WHERE l.key = old.key
  RETURNING old.token, old.fence, old.count, old.expires
)
SELECT u.token, u.fence, u.count, (extract(epoch FROM u.expires - now()) * 1e6)::bigint, (` + sqlWake + `) FROM u`

	// $1 key, $2 channel, $3 tag, $4 TTL µs. The waiter's row, and the
	// key's lock row marked (wake_until) so that releases look for
	// waiters until then; a key without a row gets a free one. A mark
	// that already lasts two thirds of the TTL is left alone: the lock row
	// is the one every acquire and release of the key updates, and a
	// crowd of waiters writing it would queue behind them (heartbeats,
	// every TTL/3, keep the mark ahead of the waiters' rows).
	sqlAddWaiter = `WITH w AS (
  INSERT INTO {s}.waiters (key, channel, tag, expires)
  VALUES ($1, $2, $3, now() + $4::bigint * interval '1 microsecond')
  ON CONFLICT (channel, tag) DO NOTHING
)
INSERT INTO {s}.locks AS l (key, token, fence, count, expires, wake_until)
SELECT $1, '', 0, 0, now(), now() + $4::bigint * interval '1 microsecond'
WHERE NOT EXISTS (SELECT 1 FROM {s}.locks m
  WHERE m.key = $1 AND m.wake_until >= now() + $4::bigint * 2 / 3 * interval '1 microsecond')
ON CONFLICT (key) DO UPDATE SET wake_until = greatest(l.wake_until, excluded.wake_until)`

	// $1 channel, $2 tag.
	sqlDelWaiter = `DELETE FROM {s}.waiters WHERE channel = $1 AND tag = $2`

	// $1 channel, $2 tags, $3 TTL µs: the waiters' rows and their keys'
	// marks renewed (as by sqlAddWaiter).
	sqlHeartbeat = `WITH w AS (
  UPDATE {s}.waiters SET expires = now() + $3::bigint * interval '1 microsecond'
  WHERE channel = $1 AND tag = ANY($2::bigint[]) RETURNING key
)
INSERT INTO {s}.locks AS l (key, token, fence, count, expires, wake_until)
SELECT DISTINCT key, '', 0::bigint, 0, now(), now() + $3::bigint * interval '1 microsecond' FROM w
WHERE NOT EXISTS (SELECT 1 FROM {s}.locks m
  WHERE m.key = w.key AND m.wake_until >= now() + $3::bigint * 2 / 3 * interval '1 microsecond')
ON CONFLICT (key) DO UPDATE SET wake_until = greatest(l.wake_until, excluded.wake_until)`

	// $1 key, $2 channel, $3 tag: a waiter that was woken but had already
	// left passes the wake-up on to the oldest other live waiter, if the
	// lock is free.
	sqlForward = `SELECT pg_notify(channel, tag || ':' || key) FROM {s}.waiters
WHERE key = $1 AND NOT (channel = $2 AND tag = $3) AND expires > now()
  AND NOT EXISTS (SELECT 1 FROM {s}.locks WHERE key = $1 AND expires > now())
ORDER BY id LIMIT 1`

	// $1 key, $2 token, $3 fence: a row while held, locked FOR SHARE
	// until the transaction ends. It runs inside the writer's transaction,
	// where now() is the transaction's start: the deadline is compared
	// with clock_timestamp(), the time the row is checked, which is also
	// after any wait for a row lock (the row is checked again then).
	// statement_timestamp() would be the statement's start, before such a
	// wait.
	sqlGuard = `SELECT 1 FROM {s}.locks WHERE key = $1 AND token = $2 AND fence = $3::bigint AND expires > clock_timestamp() FOR SHARE`

	// $1 key, $2 the TTL in ms, $3 token, $4 the TTL in µs: one row, the
	// fence (0: not granted), the server process, the settings made, and
	// when not granted {remain}: the remaining µs of the key's row, or 0
	// (unknown). Reading the row costs a grant a twentieth of its time, so
	// it is done only for attempts that need the answer (see
	// SessionBackend.TryAcquire).
	//
	// The advisory lock's id is a 64-bit hash of the schema and the key.
	// Once it is taken, the key's row in locks is taken over the way
	// sqlAcquire takes over a free one (a fence from the sequence drawn
	// after the row is locked, count 1, expires now() + TTL), but only if
	// the row is free: a row still live belongs to a grant whose session
	// ended without a release, whose holder may still believe it holds the
	// lock until that deadline (the lock-delay). The advisory lock is then
	// unlocked again in the same statement, after the upsert ran. On a
	// grant the session's idle_session_timeout becomes the TTL (the server
	// ends a session, and frees its lock, that sends nothing for a TTL),
	// and its application_name "dlock FENCE TOKEN" (cut at 63 bytes),
	// which other sessions read in pg_stat_activity.
	sqlSessionLock = `WITH g AS MATERIALIZED (SELECT pg_try_advisory_lock(hashtextextended('{n}:' || $1, 0)) AS ok),
up AS (
  INSERT INTO {s}.locks AS l (key, token, fence, count, expires)
  SELECT $1, $3, nextval('{s}.fence'), 1, now() + $4::bigint * interval '1 microsecond' FROM g WHERE g.ok
  ON CONFLICT (key) DO UPDATE SET token = excluded.token, fence = nextval('{s}.fence'), count = 1,
    expires = excluded.expires
  WHERE l.expires <= now()
  RETURNING l.fence
)
SELECT coalesce(up.fence, 0), pg_backend_pid(), CASE
    WHEN up.fence IS NOT NULL THEN set_config('idle_session_timeout', $2, false) || set_config('application_name', left('dlock ' || up.fence || ' ' || $3, 63), false)
    WHEN g.ok THEN pg_advisory_unlock(hashtextextended('{n}:' || $1, 0))::text END,
  {remain}
FROM g LEFT JOIN up ON true`

	// sqlSessionRemain is {remain} in sqlSessionLock for the variant that
	// reports the holder's remaining TTL.
	sqlSessionRemain = `CASE WHEN up.fence IS NULL THEN coalesce((SELECT (extract(epoch FROM d.expires - now()) * 1e6)::bigint
    FROM {s}.locks d WHERE d.key = $1 AND d.expires > now()), 0) ELSE 0 END`

	// $1 key: the server process holding the session lock (NULL: none),
	// its application_name, the live waiters, and the key's live row:
	// token, fence and remaining µs (NULL: none; a row outlives its
	// session until its deadline).
	sqlSessionInspect = `WITH k AS (SELECT hashtextextended('{n}:' || $1, 0) AS v)
SELECT l.pid, coalesce(a.application_name, ''), (SELECT count(*) FROM {s}.waiters w WHERE w.key = $1 AND w.expires > now()),
  d.token, d.fence, (extract(epoch FROM d.expires - now()) * 1e6)::bigint
FROM k LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ((k.v >> 32) & 4294967295)::oid AND l.objid = (k.v & 4294967295)::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
LEFT JOIN {s}.locks d ON d.key = $1 AND d.expires > now() AND d.token <> ''`

	// $1 key: frees the key's live row (ending a lock-delay), ends the
	// session holding the lock (the server then releases it) and wakes
	// the oldest live waiter. One row: rows freed, sessions ended.
	sqlSessionTerminate = `WITH k AS (SELECT hashtextextended('{n}:' || $1, 0) AS v),
d AS (UPDATE {s}.locks SET token = '', count = 0, expires = now() WHERE key = $1 AND expires > now() AND token <> '' RETURNING 1),
t AS (SELECT pg_terminate_backend(l.pid) FROM k JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ((k.v >> 32) & 4294967295)::oid AND l.objid = (k.v & 4294967295)::oid)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM t), (` + sqlWake + `)`

	// $1 the TTL in ms, $2 key, $3 token, $4 fence, $5 the TTL in µs:
	// the server process, the idle timeout set, and whether the grant's
	// row was found, its deadline moved to greatest(expires, now() +
	// TTL).
	sqlSessionPing = `WITH r AS (UPDATE {s}.locks SET expires = greatest(expires, now() + $5::bigint * interval '1 microsecond')
  WHERE key = $2 AND token = $3 AND fence = $4::bigint RETURNING 1)
SELECT pg_backend_pid(), set_config('idle_session_timeout', $1, false), EXISTS (SELECT 1 FROM r)`

	// $1 key, $2 token, $3 fence: the grant's row freed first, then the
	// session lock unlocked (reading the update's result orders the two:
	// an acquirer that takes the advisory lock meanwhile waits for this
	// transaction on the row and sees it free); whether the session held
	// the lock; whether a waiter was woken; the idle timeout and the
	// application name cleared for the pool. As in sqlRelease, the oldest
	// live waiter is woken (function wake) only when the row is marked
	// for a waiter (or was not found): a release without waiters does not
	// read the waiters table.
	sqlSessionUnlock = `WITH r AS (UPDATE {s}.locks SET token = '', count = 0, expires = least(expires, now())
  WHERE key = $1 AND token = $2 AND fence = $3::bigint RETURNING wake_until > now() AS w),
m AS (SELECT bool_or(w) AS w FROM r)
SELECT pg_advisory_unlock(hashtextextended('{n}:' || $1, 0)), CASE WHEN m.w IS NOT FALSE THEN {s}.wake($1) END,
  set_config('idle_session_timeout', '0', false) || set_config('application_name', '', false)
FROM m`

	// $1 key: sqlSessionUnlock for a hold given up without a release: the
	// row is left to its deadline and no waiter is woken.
	sqlSessionGiveUp = `SELECT pg_advisory_unlock(hashtextextended('{n}:' || $1, 0)),
  set_config('idle_session_timeout', '0', false) || set_config('application_name', '', false)`

	// $1 key, $2 server process: ends that session if it holds the key's
	// session lock (a release whose connection stayed busy); the server
	// then releases the lock.
	sqlSessionKill = `WITH k AS (SELECT hashtextextended('{n}:' || $1, 0) AS v)
SELECT pg_terminate_backend(l.pid) FROM k JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ((k.v >> 32) & 4294967295)::oid AND l.objid = (k.v & 4294967295)::oid AND l.pid = $2::integer`

	// $1 key, $2 token: the row of an attempt whose reply was lost,
	// freed (the attempt's token is its own: no other grant carries it).
	sqlSessionAbort = `UPDATE {s}.locks SET token = '', count = 0, expires = least(expires, now())
  WHERE key = $1 AND token = $2`

	// $1 age µs: rows that expired longer ago than that (lock rows also
	// marked for waiters no later than that).
	sqlSweep = `WITH l AS (DELETE FROM {s}.locks WHERE expires < now() - $1::bigint * interval '1 microsecond'
  AND wake_until < now() - $1::bigint * interval '1 microsecond' RETURNING 1),
w AS (DELETE FROM {s}.waiters WHERE expires < now() - $1::bigint * interval '1 microsecond' RETURNING 1)
SELECT (SELECT count(*) FROM l), (SELECT count(*) FROM w)`
)

// statements holds the statements for one schema. Variants spell out
// what a request decides (fence compared or not, re-entry allowed or not)
// instead of testing a parameter in SQL: the server can then plan each
// once and reuse the plan (a prepared statement with a test such as
// "$3 = 0 OR fence = $3" is planned anew on every execution, which costs
// more than running it).
type statements struct {
	acquire      [2][2]string // [reentrant][holder's TTL reported]
	acquireFree  string
	refresh      [2]string // [fenced]
	release      [2]string // [fenced]
	refreshMany  string
	inspect      string
	forceRelease string
	addWaiter    string
	delWaiter    string
	heartbeat    string
	forward      string
	sweep        string
	guard        string

	sessionLock                      [2]string // [holder's TTL reported]
	sessionPing, sessionUnlock       string
	sessionInspect, sessionTerminate string
	sessionAbort, sessionGiveUp      string
	sessionKill                      string
}

func newStatements(schema string) statements {
	q := `"` + schema + `"`
	r := strings.NewReplacer("{s}", q, "{n}", schema)
	anyFence := strings.NewReplacer("{s}", q, "{fence}", "$3::bigint = 0")
	fenced := strings.NewReplacer("{s}", q, "{fence}", "fence = $3::bigint")
	once := strings.NewReplacer("{s}", q, "{reenter}", "false")
	reenter := strings.NewReplacer("{s}", q, "{reenter}", "l.token = excluded.token")
	return statements{
		acquire: [2][2]string{
			{once.Replace(sqlAcquire), once.Replace(sqlAcquireTTL)},
			{reenter.Replace(sqlAcquire), reenter.Replace(sqlAcquireTTL)},
		},
		acquireFree:  r.Replace(sqlAcquireFree),
		refresh:      [2]string{anyFence.Replace(sqlRefresh), fenced.Replace(sqlRefresh)},
		release:      [2]string{anyFence.Replace(sqlRelease), fenced.Replace(sqlRelease)},
		refreshMany:  r.Replace(sqlRefreshMany),
		inspect:      r.Replace(sqlInspect),
		forceRelease: r.Replace(sqlForceRelease),
		addWaiter:    r.Replace(sqlAddWaiter),
		delWaiter:    r.Replace(sqlDelWaiter),
		heartbeat:    r.Replace(sqlHeartbeat),
		forward:      r.Replace(sqlForward),
		sweep:        r.Replace(sqlSweep),
		guard:        r.Replace(sqlGuard),

		sessionLock: [2]string{
			r.Replace(strings.Replace(sqlSessionLock, "{remain}", "0::bigint", 1)),
			r.Replace(strings.Replace(sqlSessionLock, "{remain}", sqlSessionRemain, 1)),
		},
		sessionPing:   r.Replace(sqlSessionPing),
		sessionUnlock: r.Replace(sqlSessionUnlock),

		sessionInspect:   r.Replace(sqlSessionInspect),
		sessionTerminate: r.Replace(sqlSessionTerminate),
		sessionAbort:     r.Replace(sqlSessionAbort),
		sessionGiveUp:    r.Replace(sqlSessionGiveUp),
		sessionKill:      r.Replace(sqlSessionKill),
	}
}
