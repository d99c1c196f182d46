package pglock

import "strings"

// The statements, with {s} standing for the quoted schema. Every one is a
// single statement in its own implicit transaction, so they work through
// transaction pooling. Times come from the server's clock: now() is the
// start of the statement. TTLs are passed in microseconds.
const (
	// $1 key, $2 token, $3 TTL µs; {reenter} is whether the holder's token
	// re-enters (Request.Reentrant). One row: granted, fence, count,
	// holder's remaining µs (when not granted). No row: held by another
	// owner whose row this statement's snapshot does not see.
	//
	// A free row (released or expired) is taken over with a fence drawn
	// in the SET list, that is after the row is locked: grants of one key
	// draw their fences in the order they are granted. The fence drawn in
	// VALUES serves only a key without a row.
	sqlAcquire = `WITH up AS (
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

	// $1 key, $2 token, $3 fence ({fence} as in sqlRefresh). One row:
	// whether a live hold was given up. The last hold frees the row
	// (token '', expires now(): the row keeps the key's last fence until
	// the sweeper deletes it) and wakes the oldest live waiter. Nothing
	// matches: nothing changes.
	sqlRelease = `WITH u AS (
  UPDATE {s}.locks SET count = count - 1,
    token = CASE WHEN count > 1 THEN token ELSE '' END,
    expires = CASE WHEN count > 1 THEN expires ELSE now() END
  WHERE key = $1 AND token = $2 AND {fence} AND expires > now()
  RETURNING count = 0 AS freed
)
SELECT EXISTS (SELECT 1 FROM u),
  CASE WHEN (SELECT freed FROM u) THEN (` + sqlWake + `) END`

	// sqlWake notifies the oldest live waiter of $1, if any. In a CASE
	// branch it runs only when the branch is taken (a wake-up in a CTE
	// of its own costs a release as much again as the delete).
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

	// $1 key, $2 channel, $3 tag, $4 TTL µs.
	sqlAddWaiter = `INSERT INTO {s}.waiters (key, channel, tag, expires)
VALUES ($1, $2, $3, now() + $4::bigint * interval '1 microsecond')
ON CONFLICT (channel, tag) DO NOTHING`

	// $1 channel, $2 tag.
	sqlDelWaiter = `DELETE FROM {s}.waiters WHERE channel = $1 AND tag = $2`

	// $1 channel, $2 tags, $3 TTL µs.
	sqlHeartbeat = `UPDATE {s}.waiters SET expires = now() + $3::bigint * interval '1 microsecond'
WHERE channel = $1 AND tag = ANY($2::bigint[])`

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

	// $1 age µs: rows that expired longer ago than that.
	sqlSweep = `WITH l AS (DELETE FROM {s}.locks WHERE expires < now() - $1::bigint * interval '1 microsecond' RETURNING 1),
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
	acquire      [2]string // [reentrant]
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
	return statements{
		acquire: [2]string{
			strings.NewReplacer("{s}", q, "{reenter}", "false").Replace(sqlAcquire),
			strings.NewReplacer("{s}", q, "{reenter}", "l.token = excluded.token").Replace(sqlAcquire),
		},
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
