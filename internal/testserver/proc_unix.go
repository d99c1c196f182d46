//go:build unix

package testserver

import (
	"errors"
	"os"
	"syscall"
)

type sysSignal = syscall.Signal

const (
	sigKill = syscall.SIGKILL
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

// terminate asks the server to shut down: SIGTERM to the server itself (it
// stops its own helpers), then SIGCONT to the group so that a paused server
// can run its handler.
func (p *proc) terminate() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}
	_ = p.signalGroup(sigCont)
	return nil
}

// signalGroup signals the child's process group (its pgid is its pid, see
// Setpgid). It is only called while the child has not been reaped, so the
// group id cannot belong to an unrelated process.
func (p *proc) signalGroup(sig syscall.Signal) error {
	if err := syscall.Kill(-p.pid, sig); err != nil {
		if err == syscall.ESRCH {
			return nil // exited meanwhile
		}
		return err
	}
	return nil
}
