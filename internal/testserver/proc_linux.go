package testserver

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sysProcAttr puts the child in its own process group and has the kernel
// SIGKILL it when the thread that forked it (see spawnLoop) exits, which
// happens at the latest when this process dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// holdsListener reports whether process pid holds a listening TCP socket on
// port. It guards readiness probes against being answered by another
// process that owns the port (say, a server of a parallel test binary that
// picked the same port), while our server is about to exit with "address
// already in use". If /proc cannot be read it reports true: no guard.
func holdsListener(pid, port int) (bool, error) {
	sockets := map[string]bool{}
	readable := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		readable = true
		lines := strings.Split(string(b), "\n")
		for _, line := range lines[1:] {
			// sl local_address rem_address st ... uid timeout inode
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A = LISTEN
				continue
			}
			i := strings.LastIndexByte(f[1], ':')
			if p, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil && int(p) == port {
				sockets["socket:["+f[9]+"]"] = true
			}
		}
	}
	if !readable {
		return true, nil
	}
	if len(sockets) == 0 {
		return false, nil
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, e := range ents {
		if link, err := os.Readlink(dir + "/" + e.Name()); err == nil && sockets[link] {
			return true, nil
		}
	}
	return false, nil
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc/PID/task/TID/stat), so that a paused server answers nothing once
// Pause returns: SIGSTOP only marks the threads, and on a loaded machine a
// thread may take a while to be scheduled and stop. It gives up silently
// after timeout, or when /proc cannot be read.
func waitStopped(pid int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		if allStopped(pid) || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// allStopped reports whether every thread of pid is stopped; true when
// /proc cannot tell.
func allStopped(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return true
	}
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // the thread exited
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return true
		}
		if s := b[i+2]; s != 'T' && s != 't' {
			return false
		}
	}
	return true
}

// CPUTime returns the CPU time process pid has used so far, every thread
// included (the sum of /proc/PID/task/TID/schedstat, in nanoseconds), for
// benchmarks that report the CPU a server or the test process spends per
// operation. It returns 0 when /proc cannot tell (and outside Linux).
func CPUTime(pid int) time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended
		}
		f, _, _ := strings.Cut(string(b), " ")
		if ns, err := strconv.ParseInt(f, 10, 64); err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}
