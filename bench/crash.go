package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// holderEnv names the environment variable that turns this binary into an
// S4 crash holder: it takes one lock and waits to be killed.
const holderEnv = "DLOCK_BENCH_HOLDER"

type holderSpec struct {
	Subject string        `json:"subject"`
	Addrs   addrs         `json:"addrs"`
	Key     string        `json:"key"`
	TTL     time.Duration `json:"ttl"`
}

// maybeHolder runs the S4 crash holder or the S5 measurement child and
// exits when the environment asks for it; otherwise it returns at once.
// main and TestMain call it first.
func maybeHolder() {
	if spec := os.Getenv(childEnv); spec != "" {
		if err := runChild(spec); err != nil {
			fmt.Fprintln(os.Stdout, "error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	spec := os.Getenv(holderEnv)
	if spec == "" {
		return
	}
	if err := runHolder(spec); err != nil {
		fmt.Fprintln(os.Stdout, "error:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runHolder(raw string) error {
	var spec holderSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return err
	}
	s := subjectByID(spec.Subject)
	if s == nil {
		return fmt.Errorf("unknown subject %q", spec.Subject)
	}
	e := newEnv(func(string, ...any) {})
	e.a = spec.Addrs
	l, err := s.open(e, openOpts{ttl: spec.TTL, poll: 2 * time.Millisecond})
	if err != nil {
		return err
	}
	ctx, cancel := opCtx()
	defer cancel()
	if _, err := l.lock(context.WithoutCancel(ctx), spec.Key); err != nil {
		return err
	}
	fmt.Fprintln(os.Stdout, "held")
	select {} // until SIGKILL
}

// measureS4: a holder process takes the lock with TTL c.s4TTL (renewing it
// if the library can), a waiter in this process starts waiting, and 300 ms
// later the holder is SIGKILLed. The figure is the time from the kill to
// the waiter's acquisition.
func measureS4(e *env, c config, s *subject, run int) (metrics, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("s4-%s-%d", s.id, run)
	waiter, err := s.open(e, openOpts{ttl: c.s4TTL, poll: c.poll})
	if err != nil {
		return nil, err
	}
	defer waiter.close()
	if err := cycle(waiter, key+"-warm"); err != nil {
		return nil, err
	}

	spec, _ := json.Marshal(holderSpec{Subject: s.id, Addrs: e.a, Key: key, TTL: c.s4TTL})
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), holderEnv+"="+string(spec))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	}()
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		for sc.Scan() {
		}
	}()
	select {
	case l := <-line:
		if l != "held" {
			return nil, fmt.Errorf("holder: %s", strings.TrimSpace(l))
		}
	case <-time.After(30 * time.Second):
		return nil, errors.New("holder did not take the lock within 30s")
	}

	type result struct {
		at  time.Time
		h   held
		err error
	}
	got := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), c.s4TTL+30*time.Second)
	defer cancel()
	go func() {
		h, err := waiter.lock(ctx, key)
		got <- result{time.Now(), h, err}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-got:
		if r.err == nil {
			_ = r.h.unlock(context.Background())
			return nil, errors.New("the waiter acquired the lock while the holder was alive")
		}
		return nil, fmt.Errorf("waiter: %w", r.err)
	default:
	}
	t0 := time.Now()
	if err := cmd.Process.Kill(); err != nil {
		return nil, err
	}
	killed = true
	r := <-got
	if r.err != nil {
		return nil, fmt.Errorf("waiter after the crash: %w", r.err)
	}
	uctx, ucancel := opCtx()
	defer ucancel()
	_ = r.h.unlock(uctx)
	d := r.at.Sub(t0)
	return metrics{
		"recovery ms": float64(d) / float64(time.Millisecond),
		"over TTL ms": float64(d-c.s4TTL) / float64(time.Millisecond),
	}, nil
}
