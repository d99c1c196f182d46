//go:build !unix

package main

import (
	"errors"
	"os"
	"os/exec"
)

// On systems without Unix process groups and signals, `dlock run` runs
// the command but can only kill the command itself (not what it started)
// when the lease is lost, and forwards only os.Interrupt. Demo part (b)
// cannot freeze a process.

var forwardedSignals = []os.Signal{os.Interrupt}

var (
	termSignal os.Signal = os.Kill
	killSignal os.Signal = os.Kill
)

var errNoGroups = errors.New("process groups are not supported on this platform")

func prepareChild(cmd *exec.Cmd) (restore func(), wait func() int) {
	return func() {}, func() int {
		_ = cmd.Wait()
		return exitStatus(cmd.ProcessState)
	}
}

func continueGroup(int) {}

func signalGroup(pgid int, sig os.Signal) error {
	p, err := os.FindProcess(pgid)
	if err != nil {
		return err
	}
	return p.Signal(sig)
}

func groupAlive(int) bool { return false }

func signalNumber(os.Signal) int { return 2 }

func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }

func stopProcess(*os.Process) error     { return errNoGroups }
func continueProcess(*os.Process) error { return errNoGroups }
