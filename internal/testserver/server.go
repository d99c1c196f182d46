package testserver

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// server is the lifecycle shared by every kind: one process at a time, the
// same arguments, directory and ports on every (re)start.
type server struct {
	name    string // for messages, e.g. "redis-server 127.0.0.1:6380"
	bin     string
	args    []string
	env     []string // nil: inherit
	dir     string   // removed by stop
	logPath string
	timeout time.Duration
	ready   func() error // one readiness probe
	ports   []int        // ports the process must hold a listener on

	mu      sync.Mutex
	p       *proc // nil when not running
	stopped bool
}

// launch starts the process without waiting for readiness. Caller holds mu
// (or has the server to itself).
func (s *server) launch() error {
	p, err := spawn(s.name, s.bin, s.args, s.dir, s.logPath, s.env)
	if err != nil {
		return err
	}
	s.p = p
	return nil
}

// awaitReady waits for the launched process; on failure it kills it.
func (s *server) awaitReady() error { return s.awaitReadyWith(s.ready) }

// awaitReadyWith is awaitReady with another probe.
func (s *server) awaitReadyWith(check func() error) error {
	if err := s.p.waitReady(s.timeout, s.ports, check); err != nil {
		_ = s.p.kill()
		s.p = nil
		return err
	}
	return nil
}

// start launches and waits. Caller holds mu (or has the server to itself).
func (s *server) start() error {
	if err := s.launch(); err != nil {
		return err
	}
	return s.awaitReady()
}

// stop ends the process (gracefully: SIGTERM first, see proc.stop; else
// SIGKILL) and removes dir. Idempotent.
func (s *server) stop(graceful bool) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	var err error
	if s.p != nil {
		if graceful {
			err = s.p.stop(StopGrace)
		} else {
			err = s.p.kill()
		}
		s.p = nil
	}
	if rmErr := os.RemoveAll(s.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("testserver: remove %s: %w", s.dir, rmErr))
	}
	return err
}

func (s *server) kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return nil
	}
	err := s.p.kill()
	s.p = nil
	return err
}

func (s *server) restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("testserver: restart %s: server was stopped", s.name)
	}
	if s.p != nil {
		if err := s.p.kill(); err != nil {
			return err
		}
		s.p = nil
	}
	return s.start()
}

func (s *server) pause() error { return s.withRunning("pause", (*proc).pause) }

func (s *server) resume() error { return s.withRunning("resume", (*proc).resume) }

// withRunning calls f on the running process under mu; it fails naming
// verb if the server is not running.
func (s *server) withRunning(verb string, f func(*proc) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return fmt.Errorf("testserver: %s %s: not running", verb, s.name)
	}
	return f(s.p)
}

func (s *server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil || s.p.exited() {
		return 0
	}
	return s.p.pid
}

// startedOrStopped returns s if err, what starting it returned, is nil;
// else it stops what s started and returns nil and both errors joined.
func startedOrStopped[T interface{ Stop() error }](s T, err error) (T, error) {
	if err != nil {
		var none T
		return none, errors.Join(err, s.Stop())
	}
	return s, nil
}

// lifecycle gives each server kind the process methods they all share. A
// kind embeds it and keeps its own Stop (safe on a nil receiver); what a
// Restart waits for and what survives a Kill is in the kind's doc.
type lifecycle struct{ srv *server }

// PID returns the process id of the running server, or 0 after Kill or
// Stop (or if it died on its own).
func (l *lifecycle) PID() int { return l.srv.pid() }

// Dir returns the server's temporary directory (its data and its log). It
// exists until Stop.
func (l *lifecycle) Dir() string { return l.srv.dir }

// LogFile returns the path of the server's log; it is appended to across
// restarts and removed with Dir by Stop.
func (l *lifecycle) LogFile() string { return l.srv.logPath }

// Kill sends SIGKILL (to the server's process group) and waits for it to
// exit; a no-op if it is not running. Dir is kept so Restart can reuse it.
func (l *lifecycle) Kill() error { return l.srv.kill() }

// Restart kills the server if it is running, starts it again with the same
// arguments, ports and directory, and waits until it is ready (bounded by
// StartTimeout). It fails if a port has been taken meanwhile or the server
// was stopped.
func (l *lifecycle) Restart() error { return l.srv.restart() }

// Pause stops the server with SIGSTOP: connections stay open but nothing
// is answered until Resume. It fails if the server is not running.
func (l *lifecycle) Pause() error { return l.srv.pause() }

// Resume continues a paused server with SIGCONT. It fails if the server is
// not running.
func (l *lifecycle) Resume() error { return l.srv.resume() }
