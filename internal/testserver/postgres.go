//go:build unix

package testserver

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PostgresOptions configures [StartPostgres]. The zero value is a
// throwaway server on a free loopback port.
type PostgresOptions struct {
	// Port is the port to listen on at 127.0.0.1. 0 (the default) picks a
	// free port, retrying with another one if the server cannot bind it.
	Port int

	// Settings are extra server settings ("name=value"), passed as -c
	// arguments after the generated ones so they override them. Default
	// none.
	Settings []string

	// StartTimeout bounds the wait for the server to accept a session, at
	// start and at every Restart. 0 means DefaultStartTimeout (60 s).
	StartTimeout time.Duration
}

// Postgres is a running PostgreSQL server (15 on Debian 12) listening on
// 127.0.0.1, with its cluster (data/, made by initdb) and its log
// (postgres.log) in its own temporary directory. The superuser is
// "postgres", authenticated by trust on loopback; there is no Unix socket.
// It runs with fsync and full_page_writes off: every committed transaction
// survives Kill and Restart (the write-ahead log is written at commit and
// the operating system keeps it) but not a machine crash. When the test runs as root, initdb and the server run as
// the system user "postgres" (PostgreSQL refuses to run as root).
//
// Its methods are safe for concurrent use.
type Postgres struct {
	port      int
	lifecycle // with its own Kill, Restart, Pause and Resume
}

// StartPostgres runs initdb in a new temporary directory, starts postgres
// and returns once the server accepts a session for user postgres on
// database postgres. On failure it returns an error ending with the tail of
// the server log and leaves nothing running or on disk. It fails with an
// error matching [ErrNotInstalled] if initdb or postgres cannot be found
// (in PATH, else under /usr/lib/postgresql/*/bin).
func StartPostgres(opts PostgresOptions) (*Postgres, error) {
	timeout, err := checkStart(opts.Port, opts.StartTimeout)
	if err != nil {
		return nil, err
	}
	bindir, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := serverDir("postgres", opts.Port)
	if err != nil {
		return nil, err
	}
	prefix, err := postgresPrefix(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	initArgs := append(prefix[1:], filepath.Join(bindir, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	bin := prefix[0]
	if bin == "" {
		bin, initArgs = initArgs[0], initArgs[1:]
	}
	cmd := exec.Command(bin, initArgs...)
	cmd.Dir = dir
	cmd.Env = filterEnv("PG")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("testserver: initdb: %w\n%s", err, out)
	}
	p, err := retryBind(opts.Port != 0, func() (*Postgres, error) {
		return tryStartPostgres(opts, timeout, bindir, prefix, dir)
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return p, nil
}

func tryStartPostgres(opts PostgresOptions, timeout time.Duration, bindir string, prefix []string, dir string) (*Postgres, error) {
	port := opts.Port
	if port == 0 {
		var err error
		if port, err = pickPort(); err != nil {
			return nil, err
		}
	}
	args := []string{
		filepath.Join(bindir, "postgres"),
		"-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=400",
		"-c", "shared_buffers=32MB",
		"-c", "logging_collector=off",
	}
	for _, s := range opts.Settings {
		args = append(args, "-c", s)
	}
	bin := prefix[0]
	if bin == "" {
		bin, args = args[0], args[1:]
	} else {
		args = append(append([]string(nil), prefix[1:]...), args...)
	}
	p := &Postgres{port: port}
	addr := p.Addr()
	p.srv = &server{
		name:    "postgres " + addr,
		bin:     bin,
		args:    args,
		env:     filterEnv("PG"),
		dir:     dir,
		logPath: filepath.Join(dir, "postgres.log"),
		timeout: timeout,
		ready:   func() error { return pgStartup(addr) },
		ports:   []int{port},
	}
	if err := p.srv.start(); err != nil {
		return nil, err
	}
	return p, nil
}

// postgresBinDir finds the directory holding initdb and postgres: PATH
// first, else the newest /usr/lib/postgresql/N/bin (Debian's layout).
func postgresBinDir() (string, error) {
	if p, err := exec.LookPath("postgres"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	return "", &notInstalledError{"testserver: postgres not found in PATH or /usr/lib/postgresql/*/bin; " +
		"install it with: apt-get install -y postgresql (or run scripts/install-servers.sh)"}
}

func pgVersion(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

// postgresPrefix returns the command that runs a PostgreSQL binary: as
// root, setpriv switching to the system user "postgres" (keeping
// Pdeathsig, which a change of user clears) after handing it dir; else
// nothing (prefix[0] == ""). PostgreSQL refuses to run as root.
func postgresPrefix(dir string) ([]string, error) {
	if os.Geteuid() != 0 {
		return []string{""}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, &notInstalledError{"testserver: running as root and there is no user postgres to run the server as; " +
			"install it with: apt-get install -y postgresql (or run scripts/install-servers.sh)"}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, fmt.Errorf("testserver: %w", err)
	}
	setpriv, err := lookPath("setpriv", "util-linux")
	if err != nil {
		return nil, err
	}
	return []string{setpriv, "--reuid=" + u.Uid, "--regid=" + u.Gid, "--clear-groups", "--pdeathsig=KILL", "--"}, nil
}

// pgStartup opens a session as user postgres on database postgres and
// closes it; it succeeds once the server answers ReadyForQuery.
func pgStartup(addr string) error {
	s, err := DialPG(addr, 2*time.Second)
	if err != nil {
		return err
	}
	return s.Close()
}

// Addr returns "127.0.0.1:PORT".
func (p *Postgres) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// Port returns the server's port.
func (p *Postgres) Port() int { return p.port }

// DSN returns a connection URL for user postgres on database postgres:
// "postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable".
func (p *Postgres) DSN() string {
	return "postgres://postgres@" + p.Addr() + "/postgres?sslmode=disable"
}

// Stop asks the server for a fast shutdown (SIGINT: sessions are
// disconnected), then stops it as every server is stopped (SIGTERM, SIGKILL
// after StopGrace), waits for it to exit and removes Dir. A paused server is
// resumed first. Stop is idempotent and safe on a nil *Postgres; after Stop
// the server cannot be restarted.
func (p *Postgres) Stop() error {
	if p == nil {
		return nil
	}
	if pid := p.srv.pid(); pid != 0 {
		signalChildren(pid, syscall.SIGCONT)
		_ = syscall.Kill(pid, syscall.SIGINT)
	}
	err := p.srv.stop(true)
	return err
}

// Kill sends SIGKILL to the postmaster's process group and to every
// session's backend, and waits for the postmaster to exit; a no-op if it is
// not running. The data directory is kept so Restart can reuse it.
func (p *Postgres) Kill() error {
	p.killChildren()
	return p.srv.kill()
}

// killChildren stops the postmaster (so it forks no more), kills its
// children, which run outside its process group, and waits until they
// have exited (a new postmaster refuses to start while one of them still
// holds the old shared memory).
func (p *Postgres) killChildren() {
	pid := p.srv.pid()
	if pid == 0 {
		return
	}
	_ = p.srv.pause()
	deadline := time.Now().Add(killWait)
	for _, c := range signalChildren(pid, syscall.SIGKILL) {
		for !gone(c) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
}

// gone reports whether process pid has exited (or is a zombie, which holds
// no memory any more).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// Restart kills the server if it is running, starts it again with the same
// port and data directory (crash recovery runs) and waits until it accepts
// a session (bounded by StartTimeout).
func (p *Postgres) Restart() error {
	p.killChildren()
	return p.srv.restart()
}

// Pause stops the postmaster and every one of its children (each session's
// backend runs in a session of its own, outside the postmaster's process
// group) with SIGSTOP until Resume, and returns once they are stopped. It
// fails if the server is not running. A session opened meanwhile is not
// answered either: its backend is never forked.
func (p *Postgres) Pause() error {
	if err := p.srv.pause(); err != nil {
		return err
	}
	for _, c := range signalChildren(p.srv.pid(), syscall.SIGSTOP) {
		waitStopped(c, time.Second)
	}
	return nil
}

// Resume continues a paused server and its children with SIGCONT. It fails
// if the server is not running.
func (p *Postgres) Resume() error {
	if pid := p.srv.pid(); pid != 0 {
		signalChildren(pid, syscall.SIGCONT)
	}
	return p.srv.resume()
}

// signalChildren sends sig to every process whose parent is pid (read from
// /proc; none elsewhere) and returns their ids.
func signalChildren(pid int, sig syscall.Signal) []int {
	if pid == 0 {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		if syscall.Kill(c, sig) == nil {
			kids = append(kids, c)
		}
	}
	return kids
}
