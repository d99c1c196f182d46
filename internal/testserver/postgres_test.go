//go:build linux

package testserver_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// pgQuery runs sql in a new session as user postgres and returns the
// first column of the first row ("" when there is none).
func pgQuery(addr string, timeout time.Duration, sql string) (string, error) {
	s, err := testserver.DialPG(addr, timeout)
	if err != nil {
		return "", err
	}
	defer s.Close()
	return s.Query(sql)
}

func mustQuery(t *testing.T, p *testserver.Postgres, sql string) string {
	t.Helper()
	v, err := pgQuery(p.Addr(), 5*time.Second, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	p, err := testserver.StartPostgres(testserver.PostgresOptions{})
	if errors.Is(err, testserver.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	if !strings.HasPrefix(p.DSN(), "postgres://postgres@127.0.0.1:") {
		t.Errorf("DSN = %q, want postgres://postgres@127.0.0.1:PORT/...", p.DSN())
	}
	t.Run("QueryAsNonRoot", func(t *testing.T) {
		if got := mustQuery(t, p, "SELECT current_setting('server_version_num')::int >= 150000"); got != "t" {
			t.Errorf("server_version_num >= 150000: got %q, want t", got)
		}
		st, err := os.Stat(fmt.Sprintf("/proc/%d", p.PID()))
		if err != nil {
			t.Fatal(err)
		}
		if uid := st.Sys().(*syscall.Stat_t).Uid; uid == 0 {
			t.Errorf("postgres runs as uid %d, want a non-root user", uid)
		}
		pgid, err := syscall.Getpgid(p.PID())
		if err != nil || pgid != p.PID() {
			t.Errorf("Getpgid(%d) = %d, %v; want its own group", p.PID(), pgid, err)
		}
	})
	t.Run("KillRestartKeepsData", func(t *testing.T) {
		mustQuery(t, p, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
		oldPID := p.PID()
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		if processAlive(oldPID) {
			t.Fatalf("pid %d alive after Kill", oldPID)
		}
		if _, err := pgQuery(p.Addr(), time.Second, "SELECT 1"); err == nil {
			t.Fatal("query after Kill succeeded")
		}
		if err := p.Restart(); err != nil {
			t.Fatal(err)
		}
		if got := mustQuery(t, p, "SELECT v FROM kept"); got != "7" {
			t.Errorf("SELECT after Restart: got %q, want 7", got)
		}
	})
	t.Run("PauseResume", func(t *testing.T) {
		checkPaused(t, p, "query", true, func() error {
			_, err := pgQuery(p.Addr(), 300*time.Millisecond, "SELECT 1")
			return err
		})
		if got := mustQuery(t, p, "SELECT 1"); got != "1" {
			t.Fatalf("SELECT 1 after Resume: got %q, want 1", got)
		}
	})
	t.Run("StopRemovesEverything", func(t *testing.T) {
		q, err := testserver.StartPostgres(testserver.PostgresOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkStop(t, q, q.PID(), q.Dir())
	})
}
