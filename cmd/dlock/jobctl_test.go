//go:build linux

package main_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dlock-go/dlock/internal/locktest"
)

// openPTY returns the two ends of a new pseudo-terminal, closed when the
// test ends.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slave.Close() })
	return master, slave
}

// TestRunJobControl runs dlock from an interactive bash in a terminal:
// Ctrl-Z stops the command and dlock's job, so that the shell gets its
// prompt back; fg continues both, with the command in the foreground
// again (it reads the terminal, Ctrl-C reaches it), and the lock is given
// back when it exits.
func TestRunJobControl(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	master, slave := openPTY(t)
	key := keyFor(t)
	sh := exec.Command("bash", "--noprofile", "--norc", "-i")
	sh.Stdin, sh.Stdout, sh.Stderr = slave, slave, slave
	sh.Env = append(os.Environ(), "PS1=$ ", "TERM=dumb", "DLOCK_BACKEND="+backendURL())
	// The terminal is the shell's controlling terminal.
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sh.Process.Kill()
		_ = sh.Wait()
	})
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(master)
		for sc.Scan() {
			lines <- strings.TrimRight(sc.Text(), "\r")
		}
		close(lines)
	}()
	var seen []string
	// await reports whether a line that matches shows within limit.
	await := func(match func(string) bool, limit time.Duration) bool {
		timeout := time.After(limit)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return false
				}
				seen = append(seen, l)
				if match(l) {
					return true
				}
			case <-timeout:
				return false
			}
		}
	}
	typ := func(b string) {
		t.Helper()
		if _, err := master.Write([]byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	// reading reports whether pid is blocked reading the terminal (in
	// read(2), or in select as readline) as its foreground process group.
	reading := func(pid int) bool {
		fg, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPGRP)
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		w := string(wchan)
		return err == nil && fg == pid && (w == "wait_woken" || w == "do_select" || strings.HasPrefix(w, "poll_schedule_timeout"))
	}
	// until types input, again every 2s (job control may flush what was
	// typed ahead while it changes the terminal's modes), until done
	// reports true, for at most 20s.
	until := func(what, input string, done func() bool) {
		t.Helper()
		for range 10 {
			typ(input)
			if done() {
				return
			}
		}
		t.Fatalf("no %s within 20s; the terminal showed %q", what, seen)
	}
	shows := func(match func(string) bool) func() bool {
		return func() bool { return await(match, 2*time.Second) }
	}
	readingSoon := func(pid int) func() bool {
		return func() bool { return locktest.Poll(2*time.Second, func() bool { return reading(pid) }) }
	}
	// The quotes keep the echo of the typed line from matching.
	typ(bin + " run " + key + ` -- sh -c 'echo "pi""d $$"; read line; echo "got $line"; sleep 30'` + "\n")
	var child int
	if !await(func(l string) bool { _, err := fmt.Sscanf(l, "pid %d", &child); return err == nil }, 20*time.Second) {
		t.Fatalf("the command did not start within 20s; the terminal showed %q", seen)
	}
	if !locktest.Poll(20*time.Second, func() bool { return reading(child) }) {
		t.Fatalf("the command is not reading the terminal; it showed %q", seen)
	}
	// Ctrl-Z stops the command, and dlock's job: the shell reports it.
	until("report of the stopped job", "\x1a", shows(func(l string) bool { return strings.Contains(l, "Stopped") }))
	// fg continues dlock, which gives the command the terminal again.
	until("shell prompt", "", readingSoon(sh.Process.Pid))
	until("command reading the terminal after fg", "fg\n", readingSoon(child))
	until("reply of the command", "hello\n", shows(func(l string) bool { return l == "got hello" }))
	// Ctrl-C reaches the command; dlock exits with its status.
	until("shell prompt after Ctrl-C", "\x03", readingSoon(sh.Process.Pid))
	until("exit status", `echo "st""atus=$?"`+"\n", shows(func(l string) bool { return strings.HasPrefix(l, "status=") }))
	if l := seen[len(seen)-1]; l != "status=130" {
		t.Fatalf("dlock's exit status: got %q, want status=130; the terminal showed %q", l, seen)
	}
	typ("exit\n")
	assertFree(t, key)
}
