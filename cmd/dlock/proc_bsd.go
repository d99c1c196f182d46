//go:build unix && !linux

package main

import "syscall"

// setDeathSignal does nothing here: only Linux can tie a child's life to
// its parent's. If dlock is killed, the command runs on unprotected.
func setDeathSignal(*syscall.SysProcAttr) (unlock func()) { return func() {} }
