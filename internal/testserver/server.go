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

func (s *server) pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return fmt.Errorf("testserver: pause %s: not running", s.name)
	}
	return s.p.pause()
}

func (s *server) resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return fmt.Errorf("testserver: resume %s: not running", s.name)
	}
	return s.p.resume()
}

func (s *server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil || s.p.exited() {
		return 0
	}
	return s.p.pid
}
