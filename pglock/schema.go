package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock-go/dlock"
)

// schemaMarker is the comment on a schema this package created; a schema
// without it is never used.
const schemaMarker = "github.com/dlock-go/dlock/pglock lease tables, version 1"

// setupLockID serializes schema creation between concurrent Backends
// (a transaction-scoped advisory lock: it works through transaction
// pooling).
const setupLockID = 0x646c6f636b5f7067 // "dlock_pg"

const sqlCreate = `CREATE SCHEMA {s};
COMMENT ON SCHEMA {s} IS '` + schemaMarker + `';
CREATE SEQUENCE {s}.fence;
CREATE TABLE {s}.locks (
  key     text PRIMARY KEY,
  token   text NOT NULL,
  fence   bigint NOT NULL,
  count   integer NOT NULL,
  expires timestamptz NOT NULL,
  wake_until timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE TABLE {s}.waiters (
  id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  key     text NOT NULL,
  channel text NOT NULL,
  tag     bigint NOT NULL,
  expires timestamptz NOT NULL,
  UNIQUE (channel, tag)
);
CREATE INDEX waiters_key ON {s}.waiters (key, id);
` + sqlCreateWake

// sqlCreateWake creates wake(k): it notifies the oldest live waiter of key k.
const sqlCreateWake = `CREATE OR REPLACE FUNCTION {s}.wake(k text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(w.channel, w.tag || ':' || w.key) FROM {s}.waiters w
    WHERE w.key = k AND w.expires > now() ORDER BY w.id LIMIT 1;
  RETURN FOUND;
END
$$;`

// sqlUpgrade brings a schema made by the first release of this package
// (no wake_until column, no wake function) to the current shape. Its
// clients keep working next to the new ones (a rolling deploy): they do
// not read the new column, and their releases wake waiters their own way.
const sqlUpgrade = `ALTER TABLE {s}.locks ADD COLUMN wake_until timestamptz NOT NULL DEFAULT '-infinity';
` + sqlCreateWake

// sqlNeedsUpgrade reports whether schema $1's locks table lacks
// wake_until.
const sqlNeedsUpgrade = `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 AND c.relname = 'locks')
  AND NOT EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 AND c.relname = 'locks' AND a.attname = 'wake_until' AND NOT a.attisdropped)`

// sqlShape lists the schema's relations with their kind and columns, and
// its functions with their arguments, one line each, sorted: what
// wantShape describes.
const sqlShape = `SELECT line FROM (
  SELECT c.relname || ' ' || c.relkind::text || coalesce(' (' || (
    SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attnum)
    FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p')) || ')', '') AS line
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
  UNION ALL
  SELECT p.proname || ' function (' || pg_get_function_identity_arguments(p.oid) || ') ' || format_type(p.prorettype, NULL)
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
) shape ORDER BY line COLLATE "C"`

var wantShape = []string{
	"fence S",
	"locks r (key text not null, token text not null, fence bigint not null, count integer not null, expires timestamp with time zone not null, wake_until timestamp with time zone not null)",
	"locks_pkey i",
	"waiters r (id bigint not null, key text not null, channel text not null, tag bigint not null, expires timestamp with time zone not null)",
	"waiters_channel_tag_key i",
	"waiters_id_seq S",
	"waiters_key i",
	"waiters_pkey i",
	"wake function (k text) boolean",
}

const sqlPrivileges = `SELECT has_schema_privilege(current_user, $1, 'USAGE')
  AND has_table_privilege(current_user, format('%I.locks', $1), 'SELECT, INSERT, UPDATE, DELETE')
  AND has_table_privilege(current_user, format('%I.waiters', $1), 'SELECT, INSERT, UPDATE, DELETE')
  AND has_sequence_privilege(current_user, format('%I.fence', $1), 'USAGE')
  AND has_function_privilege(current_user, format('%I.wake(text)', $1), 'EXECUTE'),
  current_user`

// setup creates the schema if it does not exist, then checks that it is
// ours, has the expected shape and that the current role may use it.
// One call at a time sets up; the others wait for it within their own
// contexts.
func (b *Backend) setup(ctx context.Context) error {
	if b.ready.Load() {
		return nil
	}
	select {
	case b.setupSlot <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("pglock: set up schema %q: %w", b.cfg.schema, ctx.Err())
	}
	defer func() { <-b.setupSlot }()
	if b.ready.Load() {
		return nil
	}
	s := b.cfg.schema
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(setupLockID)); err != nil {
			return err
		}
		var comment *string
		err := tx.QueryRow(ctx, "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1", s).Scan(&comment)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			_, err = tx.Exec(ctx, strings.ReplaceAll(sqlCreate, "{s}", `"`+s+`"`))
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "42501" {
				return fmt.Errorf("pglock: the role may not create schema %q (grant CREATE on the database, or create it as a privileged role with this backend once): %w", s, err)
			}
			return err
		case err != nil:
			return err
		case comment == nil || *comment != schemaMarker:
			return fmt.Errorf("pglock: %w: schema %q exists and was not created by pglock (its comment is not %q); choose another with WithSchema", dlock.ErrWrongType, s, schemaMarker)
		}
		var upgrade bool
		if err := tx.QueryRow(ctx, sqlNeedsUpgrade, s).Scan(&upgrade); err != nil || !upgrade {
			return err
		}
		_, err = tx.Exec(ctx, strings.ReplaceAll(sqlUpgrade, "{s}", `"`+s+`"`))
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			return fmt.Errorf("pglock: schema %q was made by an earlier version of pglock and the role may not upgrade it (run this backend once as its owner): %w", s, err)
		}
		return err
	})
	if err != nil {
		if strings.HasPrefix(err.Error(), "pglock: ") {
			return err
		}
		return fmt.Errorf("pglock: set up schema %q: %w", s, err)
	}
	rows, err := b.pool.Query(ctx, sqlShape, s)
	if err != nil {
		return fmt.Errorf("pglock: check schema %q: %w", s, err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("pglock: check schema %q: %w", s, err)
	}
	if strings.Join(got, "\n") != strings.Join(wantShape, "\n") {
		return fmt.Errorf("pglock: %w: schema %q does not have the shape pglock created:\n  got:  %s\n  want: %s",
			dlock.ErrWrongType, s, strings.Join(got, "\n        "), strings.Join(wantShape, "\n        "))
	}
	var ok bool
	var role string
	if err := b.pool.QueryRow(ctx, sqlPrivileges, s).Scan(&ok, &role); err != nil {
		return fmt.Errorf("pglock: check privileges on schema %q: %w", s, err)
	}
	if !ok {
		return fmt.Errorf("pglock: role %q lacks privileges on schema %q: it needs USAGE on the schema and the sequence fence, SELECT, INSERT, UPDATE, DELETE on tables locks and waiters, and EXECUTE on function wake(text)", role, s)
	}
	b.ready.Store(true)
	return nil
}
