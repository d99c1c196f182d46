//go:build !unix

package testserver

import (
	"errors"
	"os"
	"syscall"
	"time"
)

type sysSignal int

const (
	sigKill sysSignal = iota
	sigStop
	sigCont
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

// terminate has no graceful variant without Unix signals: it kills.
func (p *proc) terminate() error { return errors.New("no SIGTERM on this platform") }

func (p *proc) signalGroup(sig sysSignal) error {
	if sig == sigKill {
		if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return err
		}
		return nil
	}
	return errors.New("pause and resume need Unix signals")
}

// holdsListener cannot tell without /proc: it reports true (no guard).
func holdsListener(pid, port int) (bool, error) { return true, nil }

// waitStopped has nothing to wait for: pause is not supported.
func waitStopped(pid int, timeout time.Duration) {}

// CPUTime cannot tell without /proc: it returns 0.
func CPUTime(pid int) time.Duration { return 0 }
