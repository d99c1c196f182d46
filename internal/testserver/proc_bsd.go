//go:build unix && !linux

package testserver

import (
	"syscall"
	"time"
)

// sysProcAttr puts the child in its own process group. There is no Pdeathsig
// outside Linux: a child outlives a parent that dies without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// holdsListener cannot tell without /proc: it reports true (no guard).
func holdsListener(pid, port int) (bool, error) { return true, nil }

// waitStopped cannot tell without /proc: it returns at once.
func waitStopped(pid int, timeout time.Duration) {}

// CPUTime cannot tell without /proc: it returns 0.
func CPUTime(pid int) time.Duration { return 0 }
