package verify

import "syscall"

// setPdeathsig has the kernel SIGKILL the worker when the coordinator's
// forking thread exits: Go only ends threads locked by a goroutine that
// exits, which the coordinator never does, so in practice this fires when
// the coordinator dies.
func setPdeathsig(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
