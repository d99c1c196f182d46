package main

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/pglock"
)

// newPGBackend connects a pool to the PostgreSQL servers of spec, checks
// within timeout that one answers and that the lock tables can be used,
// and returns the pglock backend and a function closing the pool. The
// URL's path is the database; the query parameter schema names the
// backend's schema (default pglock.DefaultSchema), mode=session holds
// locks as session advisory locks (pglock.NewSession; default
// mode=lease, the lease table), every other parameter goes to pgx
// (sslmode, application_name, ...). Statements run without prepared
// statements, so in lease mode the URL may name a transaction-pooling
// proxy; notify_host=HOST[:PORT] then names the server itself for the one
// LISTEN session, and notify=off turns notifications off.
func newPGBackend(ctx context.Context, spec *backendSpec, timeout time.Duration) (dlock.Backend, func() error, error) {
	bad := func(format string, args ...any) error {
		return usageErrorf("invalid backend URL %q: "+format, append([]any{spec.redacted()}, args...)...)
	}
	q := url.Values{}
	var opts []pglock.Option
	notifyHost, notify, session := "", true, false
	for k, vs := range spec.query {
		v := vs[len(vs)-1]
		switch k {
		case "mode":
			if v != "lease" && v != "session" {
				return nil, nil, bad("mode=%q: want lease or session", v)
			}
			session = v == "session"
		case "schema":
			opts = append(opts, pglock.WithSchema(v))
		case "notify":
			if v != "off" && v != "on" {
				return nil, nil, bad("notify=%q: want on or off", v)
			}
			notify = v == "on"
		case "notify_host":
			h, err := hostPort(v, 5432)
			if err != nil {
				return nil, nil, bad("notify_host: %v", err)
			}
			notifyHost = h
		default:
			q[k] = vs
		}
	}
	dsn := pgURL(spec, strings.Join(spec.hosts, ","), q)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, nil, bad("%v", err)
	}
	cfg.ConnConfig.ConnectTimeout = timeout
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	switch {
	case !notify:
		opts = append(opts, pglock.WithoutListen())
	case notifyHost != "":
		lc, err := pgx.ParseConfig(pgURL(spec, notifyHost, q))
		if err != nil {
			return nil, nil, bad("notify_host: %v", err)
		}
		lc.ConnectTimeout = timeout
		opts = append(opts, pglock.WithListenConfig(lc))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, bad("%v", err)
	}
	closeFn := func() error { pool.Close(); return nil }
	var b interface {
		dlock.Backend
		dlock.Inspector
		Err() error
	}
	if session {
		b = pglock.NewSession(pool, opts...)
	} else {
		b = pglock.New(pool, opts...)
	}
	if err := b.Err(); err != nil {
		pool.Close()
		return nil, nil, bad("%v", err)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, nil, unavailable("postgres", strings.Join(spec.hosts, ","), timeout, err)
	}
	// Create or check the schema now, so a foreign schema or missing
	// privileges are reported before any command runs.
	if _, err := b.Inspect(pctx, "dlock-ping"); err != nil {
		pool.Close()
		return nil, nil, exitWith(exitFailure, err)
	}
	return b, closeFn, nil
}

// pgURL rebuilds a postgres:// URL for hosts from spec's user, password
// and database, with query q.
func pgURL(spec *backendSpec, hosts string, q url.Values) string {
	u := url.URL{Scheme: "postgres", Host: hosts, Path: "/" + spec.path, RawQuery: q.Encode()}
	if spec.user != "" || spec.password != "" {
		u.User = url.UserPassword(spec.user, spec.password)
		if spec.password == "" {
			u.User = url.User(spec.user)
		}
	}
	return u.String()
}
