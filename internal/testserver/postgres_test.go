//go:build linux

package testserver_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// pgQuery runs sql with the simple query protocol as user postgres and
// returns the first column of the first row ("" when there is none).
func pgQuery(addr string, timeout time.Duration, sql string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	startup := []byte("\x00\x03\x00\x00user\x00postgres\x00database\x00postgres\x00\x00")
	if _, err := conn.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(startup)+4)), startup...)); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	var first string
	var got, queried bool
	var qerr error
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return "", err
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[1:])-4)
		if _, err := io.ReadFull(r, body); err != nil {
			return "", err
		}
		switch hdr[0] {
		case 'E':
			qerr = fmt.Errorf("postgres: %s", bytes.ReplaceAll(body, []byte{0}, []byte{' '}))
			if !queried {
				return "", qerr
			}
		case 'D':
			if !got && binary.BigEndian.Uint16(body) > 0 {
				if n := int32(binary.BigEndian.Uint32(body[2:])); n >= 0 {
					first = string(body[6 : 6+n])
				}
				got = true
			}
		case 'Z':
			if queried {
				_, _ = conn.Write([]byte{'X', 0, 0, 0, 4})
				return first, qerr
			}
			q := append([]byte(sql), 0)
			msg := append([]byte{'Q'}, binary.BigEndian.AppendUint32(nil, uint32(len(q)+4))...)
			if _, err := conn.Write(append(msg, q...)); err != nil {
				return "", err
			}
			queried = true
		}
	}
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
