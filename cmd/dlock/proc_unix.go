//go:build unix

package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// forwardedSignals are relayed by `dlock run` to the command's process
// group; the lock stays held until the command exits.
var forwardedSignals = []os.Signal{
	syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2,
}

// prepareChild makes cmd run in a process group of its own, so that a
// lost lease can stop the command and everything it started. When dlock
// runs in the foreground of a terminal, the command's group becomes the
// foreground group (it can read the terminal, and Ctrl-C and Ctrl-Z reach
// it directly); restore gives the terminal back after the command exits.
// On Linux the command is also killed if dlock dies (see setDeathSignal):
// call prepareChild, Start and restore on the same goroutine. wait, called
// once after Start, waits for the command and returns its shell-style
// exit status.
func prepareChild(cmd *exec.Cmd) (restore func(), wait func() int) {
	attr := &syscall.SysProcAttr{Setpgid: true}
	unlock := setDeathSignal(attr)
	restore = unlock
	wait = func() int {
		_ = cmd.Wait()
		return exitStatus(cmd.ProcessState)
	}
	fd := int(os.Stdin.Fd())
	if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil && fg == syscall.Getpgrp() {
		attr.Foreground = true
		attr.Ctty = fd
		restore = func() {
			giveTerminal(fd, syscall.Getpgrp())
			unlock()
		}
		wait = func() int { return waitForeground(cmd, fd) }
	}
	cmd.SysProcAttr = attr
	return restore, wait
}

// giveTerminal makes pgid the foreground group of the terminal fd. dlock
// may be in a background group when it does: that would stop it with
// SIGTTOU unless that is ignored.
func giveTerminal(fd, pgid int) {
	signal.Ignore(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, pgid)
	signal.Reset(syscall.SIGTTOU)
}

// waitForeground waits for cmd, which has the terminal fd, and returns its
// exit status. When the terminal stops the command (Ctrl-Z: SIGTSTP),
// dlock takes the terminal back and stops its own job, so that the shell
// gets its prompt back; continued (fg, bg), it continues the command, and
// gives it the terminal again when dlock has it. While dlock is stopped
// its lease is not renewed.
func waitForeground(cmd *exec.Cmd, fd int) int {
	pid := cmd.Process.Pid
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return 1 // not ours to wait for: cannot happen after Start
		case ws.Stopped():
			if ws.StopSignal() == syscall.SIGTSTP {
				suspend(fd, pid)
			}
			continue
		}
		_ = cmd.Process.Release()
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

// suspend stops dlock's job after the terminal stopped its command (group
// pgid), then continues the command when dlock is continued, giving it
// the terminal again when dlock has it (fg rather than bg). A group
// without a parent to continue it (orphaned: dlock was not started by a
// job-control shell) is not stopped: the command is continued at once.
func suspend(fd, pgid int) {
	me := syscall.Getpgrp()
	ppid := os.Getppid()
	ppg, err1 := syscall.Getpgid(ppid)
	psid, err2 := unix.Getsid(ppid)
	sid, err3 := unix.Getsid(0)
	if err1 == nil && err2 == nil && err3 == nil && ppg != me && psid == sid {
		cont := make(chan os.Signal, 1)
		signal.Notify(cont, syscall.SIGCONT)
		giveTerminal(fd, me)
		_ = syscall.Kill(-me, syscall.SIGTSTP)
		<-cont // the stop may take effect after kill returns
		signal.Stop(cont)
		if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil && fg == me {
			giveTerminal(fd, pgid)
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
}

// continueGroup continues the stopped processes of group pgid (a signal
// to end them takes effect only then).
func continueGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGCONT) }

// signalGroup sends sig to the process group pgid.
func signalGroup(pgid int, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return errors.New("not a signal of this platform")
	}
	return syscall.Kill(-pgid, s)
}

// groupAlive reports whether any process of group pgid is still alive.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killSignal and termSignal are the signals a lost lease sends.
var (
	termSignal os.Signal = syscall.SIGTERM
	killSignal os.Signal = syscall.SIGKILL
)

// signalNumber is the number shells add to 128 in an exit status.
func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// exitStatus returns the shell-style exit status of a finished process:
// its exit code, or 128+N when signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// stopProcess freezes the child process p (demo part b) and returns once
// it is stopped: kill(2) only queues SIGSTOP, and a busy process can run on
// for a while before every thread has stopped. If p exits instead, its
// status is reaped here and an error returned.
func stopProcess(p *os.Process) error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(p.Pid, &ws, syscall.WUNTRACED, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return err
		case ws.Stopped():
			return nil
		case ws.Exited() || ws.Signaled():
			return errors.New("the process exited instead of stopping")
		}
	}
}

// continueProcess thaws a process frozen by stopProcess.
func continueProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
