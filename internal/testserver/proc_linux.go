package testserver

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
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
