package redislock_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// processCPU returns the CPU time this process has used (getrusage).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// threadsCPU returns the CPU time the threads of process pid have used,
// in nanoseconds (the first field of /proc/PID/task/TID/schedstat).
func threadsCPU(b *testing.B, pid int) time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	var sum time.Duration
	for _, e := range ents {
		s, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended
		}
		f, _, _ := strings.Cut(string(s), " ")
		ns, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("%s/%s/schedstat: %q: %v", dir, e.Name(), s, err)
		}
		sum += time.Duration(ns)
	}
	return sum
}
