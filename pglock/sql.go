package pglock

import "strings"

// The statements, with {s} standing for the quoted schema. Every one is a
// single statement in its own implicit transaction, so they work through
// transaction pooling. Times come from the server's clock: now() is the
// start of the statement. TTLs are passed in microseconds.
const (
	// $1 key, $2 token, $3 TTL µs; {reenter} is whether the holder's token
	// re-enters (Request.Reentrant). One row: granted, fence, count, 0.
	// No row: not granted.
	//
	// A free row (released or expired) is taken over with a fence drawn
	// in the SET list, that is after the row is locked: grants of one key
	// draw their fences in the order they are granted. The fence drawn in
	// VALUES serves only a key without a row.
	sqlAcquire = `INSERT INTO {s}.locks AS l (key, token, fence, count, expires)
  VALUES ($1, $2, nextval('{s}.fence'), 1, now() + $3::bigint * interval '1 microsecond')
  ON CONFLICT (key) DO UPDATE SET
    token = excluded.token,
    fence = CASE WHEN l.expires > now() THEN l.fence ELSE nextval('{s}.fence') END,
    count = CASE WHEN l.expires > now() THEN l.count + 1 ELSE 1 END,
    expires = CASE WHEN l.expires > now() THEN greatest(l.expires, excluded.expires) ELSE excluded.expires END
  WHERE l.expires <= now() OR {reenter}
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
  INSERT INTO {s}.locks AS l (key, token, fence, count, expires)
  VALUES ($1, $2, nextval('{s}.fence'), 1, now() + $3::bigint * interval '1 microsecond')
  ON CONFLICT (key) DO UPDATE SET
    token = excluded.token,
    fence = CASE WHEN l.expires > now() THEN l.fence ELSE nextval('{s}.fence') END,
    count = CASE WHEN l.expires > now() THEN l.count + 1 ELSE 1 END,
    expires = CASE WHEN l.expires > now() THEN greatest(l.expires, excluded.expires) ELSE excluded.expires END
  WHERE l.expires <= now() OR {reenter}
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
	// until the transaction ends.
	sqlGuard = `SELECT 1 FROM {s}.locks WHERE key = $1 AND token = $2 AND fence = $3::bigint AND expires > now() FOR SHARE`

	// $1 key: a fence (0: not taken) and the server process. The advisory
	// lock's id is a 64-bit hash of the schema and the key; the fence is
	// drawn after the lock is taken.
	// $2 is the lease's TTL in ms: once the lock is taken the session's
	// idle_session_timeout, so that the server ends a session (and frees
	// its lock) that sends nothing for a TTL. $3 is the token: with the
	// fence, the session's application_name ("dlock FENCE TOKEN", cut at
	// 63 bytes), which other sessions read in pg_stat_activity.
	sqlSessionLock = `SELECT f, pg_backend_pid(), CASE WHEN f > 0 THEN
    set_config('idle_session_timeout', $2, false) || set_config('application_name', left('dlock ' || f || ' ' || $3, 63), false) END
FROM (SELECT CASE WHEN pg_try_advisory_lock(hashtextextended('{n}:' || $1, 0))
  THEN nextval('{s}.fence') ELSE 0 END AS f) grant_`

	// $1 key: the server process holding the session lock (NULL: none),
	// its application_name, and the live waiters.
	sqlSessionInspect = `WITH k AS (SELECT hashtextextended('{n}:' || $1, 0) AS v)
SELECT l.pid, coalesce(a.application_name, ''), (SELECT count(*) FROM {s}.waiters w WHERE w.key = $1 AND w.expires > now())
FROM k LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ((k.v >> 32) & 4294967295)::oid AND l.objid = (k.v & 4294967295)::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid`

	// $1 key: ends the session holding the lock (the server then releases
	// it) and wakes the oldest live waiter. A row (the process) when there
	// was one.
	sqlSessionTerminate = `WITH k AS (SELECT hashtextextended('{n}:' || $1, 0) AS v)
SELECT l.pid, pg_terminate_backend(l.pid), (` + sqlWake + `)
FROM k JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.classid = ((k.v >> 32) & 4294967295)::oid AND l.objid = (k.v & 4294967295)::oid`

	// $1 the TTL in ms: the server process and the idle timeout set.
	sqlSessionPing = `SELECT pg_backend_pid(), set_config('idle_session_timeout', $1, false)`

	// $1 key: whether the session held the lock; the idle timeout and
	// the application name are cleared for the pool, and the oldest live
	// waiter is woken.
	sqlSessionUnlock = `SELECT pg_advisory_unlock(hashtextextended('{n}:' || $1, 0)),
  (` + sqlWake + `), set_config('idle_session_timeout', '0', false) || set_config('application_name', '', false)`

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

	sessionLock, sessionPing, sessionUnlock string
	sessionInspect, sessionTerminate        string
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

		sessionLock:   r.Replace(sqlSessionLock),
		sessionPing:   r.Replace(sqlSessionPing),
		sessionUnlock: r.Replace(sqlSessionUnlock),

		sessionInspect:   r.Replace(sqlSessionInspect),
		sessionTerminate: r.Replace(sqlSessionTerminate),
	}
}
