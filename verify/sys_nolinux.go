//go:build unix && !linux

package verify

import "syscall"

// setPdeathsig does nothing outside Linux: a worker outlives a coordinator
// killed without cleanup until it notices that its standard input closed.
func setPdeathsig(*syscall.SysProcAttr) {}
