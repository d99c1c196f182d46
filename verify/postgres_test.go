package verify_test

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/pglock"
	"github.com/dlock-go/dlock/verify"
)

// pgWorkerArg is the first argument of the worker processes of the
// Postgres runs: they open the backend with openPostgres instead of the
// factory TestMain hands to the other workers.
const pgWorkerArg = "pglock-worker"

// init runs a Postgres worker before TestMain would run a worker with the
// tests' Redis factory.
func init() {
	if os.Getenv(verify.WorkerEnv) == "1" && len(os.Args) == 3 && os.Args[1] == pgWorkerArg {
		os.Exit(verify.WorkerMain(context.Background(), os.Args[2:], openPostgres))
	}
}

// openPostgres opens a postgres:// URL as the dlock CLI does: pglock's
// lease table, or with mode=session its session advisory locks; the other
// query parameters go to pgx.
func openPostgres(ctx context.Context, raw string, _ time.Duration) (dlock.Backend, func() error, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, err
	}
	q := u.Query()
	session := q.Get("mode") == "session"
	q.Del("mode")
	q.Set("pool_max_conns", "4")
	q.Set("default_query_exec_mode", "exec")
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return nil, nil, err
	}
	closePool := func() error { pool.Close(); return nil }
	if session {
		return pglock.NewSession(pool), closePool, nil
	}
	return pglock.New(pool), closePool, nil
}

// TestPostgres runs the harness on a throwaway PostgreSQL server in both
// modes. The lease table keeps its promises under holder pauses and a
// server restart (the table and the fence sequence survive it), the
// session mode under holder pauses (the server ends a paused holder's
// session after its idle timeout, the TTL); the naive register, the
// negative control, loses updates in both.
func TestPostgres(t *testing.T) {
	for _, tc := range []struct{ name, url, faults string }{
		{"lease", "postgres://local", "pause+restart"},
		{"session", "postgres://local?mode=session", "pause"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := shortConfig(t, tc.faults)
			cfg.BackendURL, cfg.Name = tc.url, "pglock-"+tc.name
			cfg.Exe = append(workerExe(t), pgWorkerArg)
			rep, err := verify.Run(context.Background(), cfg, openPostgres)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			t.Logf("\n%s", rep.Table())
			if got := len(rep.Runs); got != 1 {
				t.Fatalf("got %d runs, want 1", got)
			}
			assertPausesCaught(t, rep.Runs[0])
		})
	}
}

// A local Postgres URL names the one database the throwaway server has.
func TestPostgresLocalDatabase(t *testing.T) {
	cfg := verify.DefaultConfig()
	cfg.BackendURL = "postgres://local/app"
	cfg.Faults = []string{verify.FaultNone}
	cfg.OutDir = t.TempDir()
	cfg.Exe = workerExe(t)
	_, err := verify.Run(context.Background(), cfg, openPostgres)
	if err == nil || !strings.Contains(err.Error(), `only the database "postgres"`) {
		t.Fatalf("Run on postgres://local/app: got %v, want an error naming the database postgres", err)
	}
}
