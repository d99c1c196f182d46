//go:build unix

package verify

import (
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// supported reports whether worker processes and their faults work here.
const supported = true

// monoNow reads CLOCK_MONOTONIC: one clock shared by every process on the
// machine (Go's own monotonic readings are per process and cannot be
// compared across processes). It keeps counting while a process is
// stopped with SIGSTOP.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC exists on every Unix Go supports; a failure here
		// would make every timestamp meaningless.
		panic("verify: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

func stopProcess(pid int) error { return unix.Kill(pid, unix.SIGSTOP) }
func contProcess(pid int) error { return unix.Kill(pid, unix.SIGCONT) }
func killProcess(pid int) error { return unix.Kill(pid, unix.SIGKILL) }

// setWorkerAttrs puts a worker in its own process group, so a Ctrl-C in a
// terminal reaches only the coordinator (which then stops the workers
// itself), and on Linux has the kernel kill it if the coordinator dies.
func setWorkerAttrs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setPdeathsig(cmd.SysProcAttr)
}
