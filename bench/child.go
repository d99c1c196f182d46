package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// childEnv names the environment variable that turns this binary into an
// S5 measurement child: it measures one subject and prints the figures.
const childEnv = "DLOCK_BENCH_CHILD"

type childSpec struct {
	childTarget
	Run       int           `json:"run"`
	Config    savedConfig   `json:"config"`
	OpTimeout time.Duration `json:"op_timeout"`
}

const resultPrefix = "RESULT "

// notePrefix starts a line of the child for the parent's log (why leases
// were lost, where a stalled library's goroutines are).
const notePrefix = "NOTE "

// runChild measures what spec says and prints one RESULT line.
func runChild(raw string) error {
	spec, s, e, err := decodeSpec[childSpec](raw)
	if err != nil {
		return err
	}
	opTimeout = spec.OpTimeout
	m, err := measureS5Local(e, spec.Config.config(), s, spec.Run)
	if err != nil {
		return err
	}
	b, err := json.Marshal(clean(m))
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stdout, resultPrefix+string(b))
	return nil
}

// measureS5 runs measureS5Local in a child process.
func measureS5(e *env, c config, s *subject, run int) (metrics, error) {
	if r := s.reason(); r != "" {
		return nil, unavailable("%s", r)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, err := json.Marshal(childSpec{
		childTarget: childTarget{s.id, e.a}, Run: run, Config: saveConfig(c), OpTimeout: opTimeout,
	})
	if err != nil {
		return nil, err
	}
	// A child that hangs is stopped with SIGQUIT (its goroutines are dumped
	// to the stderr that is reported) once it overruns its budget.
	budget := c.s5FillMax + c.s5Hold + 5*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	for _, line := range strings.Split(stdout.String(), "\n") {
		if note, ok := strings.CutPrefix(line, notePrefix); ok {
			fmt.Fprintf(os.Stderr, "%s S5 %s: %s\n", time.Now().Format("15:04:05"), s.id, note)
		}
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if js, ok := strings.CutPrefix(line, resultPrefix); ok {
			var m metrics
			if err := json.Unmarshal([]byte(js), &m); err != nil {
				return nil, err
			}
			return m, nil
		}
	}
	msg := strings.TrimSpace(stdout.String())
	if ctx.Err() != nil {
		msg = fmt.Sprintf("did not finish within %v, stopped with SIGQUIT; %s", budget, msg)
	}
	if tail := firstLines(stderr.String(), 3); tail != "" {
		msg = strings.TrimSpace(msg + " " + tail)
	}
	return nil, errors.New("child " + fmt.Sprint(runErr) + ": " + msg)
}

// firstLines returns the first n non-empty lines of s, joined by " / "
// (a Go panic's message and where it happened).
func firstLines(s string, n int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "redis:") {
			out = append(out, l)
			if len(out) == n {
				break
			}
		}
	}
	return strings.Join(out, " / ")
}

func subjectByID(id string) *subject {
	for _, s := range subjects() {
		if s.id == id {
			return s
		}
	}
	return nil
}
