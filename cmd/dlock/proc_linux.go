//go:build linux

package main

import (
	"runtime"
	"syscall"
)

// setDeathSignal makes the kernel SIGKILL the command if dlock dies
// without stopping it (SIGKILL, OOM killer): nobody would renew the lease
// any more, and another host could take the lock while the command still
// ran. The signal fires when the thread that forked the command exits, so
// the caller stays locked to its thread until the command has exited
// (unlock, returned, undoes that).
func setDeathSignal(attr *syscall.SysProcAttr) (unlock func()) {
	attr.Pdeathsig = syscall.SIGKILL
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}
