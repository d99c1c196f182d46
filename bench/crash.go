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
	childTarget
	Key string        `json:"key"`
	TTL time.Duration `json:"ttl"`
	// Lead makes the holder campaign in the election on Key (K3) instead
	// of taking the lock.
	Lead bool `json:"lead,omitempty"`
}

// maybeHolder runs the S4 crash holder or the S5 measurement child and
// exits when the environment asks for it; otherwise it returns at once.
// main and TestMain call it first.
func maybeHolder() {
	for _, child := range []struct {
		env string
		run func(spec string) error
	}{{childEnv, runChild}, {holderEnv, runHolder}} {
		spec := os.Getenv(child.env)
		if spec == "" {
			continue
		}
		if err := child.run(spec); err != nil {
			fmt.Fprintln(os.Stdout, "error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// childTarget is what the spec of every child process names: the subject
// and the servers it runs on.
type childTarget struct {
	Subject string `json:"subject"`
	Addrs   addrs  `json:"addrs"`
}

func (t childTarget) target() childTarget { return t }

// decodeSpec decodes a child process's spec from raw and returns it with
// the subject it names and an env on its servers.
func decodeSpec[T any, P interface {
	*T
	target() childTarget
}](raw string) (*T, *subject, *env, error) {
	spec := new(T)
	if err := json.Unmarshal([]byte(raw), spec); err != nil {
		return nil, nil, nil, err
	}
	t := P(spec).target()
	s := subjectByID(t.Subject)
	if s == nil {
		return nil, nil, nil, fmt.Errorf("unknown subject %q", t.Subject)
	}
	e := newEnv(func(string, ...any) {})
	e.a = t.Addrs
	return spec, s, e, nil
}

func runHolder(raw string) error {
	spec, s, e, err := decodeSpec[holderSpec](raw)
	if err != nil {
		return err
	}
	o := openOpts{ttl: spec.TTL, poll: 2 * time.Millisecond}
	ctx, cancel := opCtx()
	defer cancel()
	if spec.Lead {
		el, err := openElector(e, s, o)
		if err != nil {
			return err
		}
		if _, err := el.campaign(context.WithoutCancel(ctx), spec.Key, "crashed"); err != nil {
			return err
		}
	} else {
		l, err := s.open(e, o)
		if err != nil {
			return err
		}
		if _, err := l.lock(context.WithoutCancel(ctx), spec.Key); err != nil {
			return err
		}
	}
	fmt.Fprintln(os.Stdout, "held")
	select {} // until SIGKILL
}

// startHolder starts a crash holder process (this binary, re-executed)
// and returns it once it holds what spec says. The caller kills it and
// waits for it (Process.Kill, Wait).
func startHolder(spec holderSpec) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, _ := json.Marshal(spec)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), holderEnv+"="+string(js))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		return nil, err
	}
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
	var failed error
	select {
	case l := <-line:
		if l != "held" {
			failed = fmt.Errorf("holder: %s", strings.TrimSpace(l))
		}
	case <-time.After(30 * time.Second):
		failed = errors.New("holder did not take the lock within 30s")
	}
	if failed != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, failed
	}
	return cmd, nil
}

// measureS4: a holder process takes the lock with TTL c.s4TTL (renewing it
// if the library can), a waiter in this process starts waiting, and 300 ms
// later the holder is SIGKILLed. The figure is the time from the kill to
// the waiter's acquisition.
func measureS4(e *env, c config, s *subject, run int) (metrics, error) {
	return measureTakeover(e, c, s, run, false)
}

// measureTakeover is S4 (lead false) or K3 (lead true: the holder leads
// the election on the key and the waiter campaigns in it).
func measureTakeover(e *env, c config, s *subject, run int, lead bool) (metrics, error) {
	key := fmt.Sprintf("s4-%s-%d", s.id, run)
	o := openOpts{ttl: c.s4TTL, poll: c.poll}
	var take func(ctx context.Context, key string) (held, error)
	if lead {
		key = fmt.Sprintf("k3-%s-%d", s.id, run)
		el, err := openElector(e, s, o)
		if err != nil {
			return nil, err
		}
		defer el.close()
		take = func(ctx context.Context, key string) (held, error) { return el.campaign(ctx, key, "waiter") }
	} else {
		waiter, err := s.open(e, o)
		if err != nil {
			return nil, err
		}
		defer waiter.close()
		take = waiter.lock
	}
	// Warm-up: connections, scripts, sessions.
	wctx, wcancel := opCtx()
	h, err := take(wctx, key+"-warm")
	if err == nil {
		err = h.unlock(wctx)
	}
	wcancel()
	if err != nil {
		return nil, err
	}

	cmd, err := startHolder(holderSpec{childTarget: childTarget{s.id, e.a}, Key: key, TTL: c.s4TTL, Lead: lead})
	if err != nil {
		return nil, err
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	}()

	type result struct {
		at  time.Time
		h   held
		err error
	}
	got := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), c.s4TTL+30*time.Second)
	defer cancel()
	go func() {
		h, err := take(ctx, key)
		got <- result{time.Now(), h, err}
	}()
	if lead {
		// Just after the leader's first renewal (TTL/3): its lease has
		// about TTL − 100 ms left, close to the longest a fail-over waits.
		time.Sleep(c.s4TTL/3 + 100*time.Millisecond)
	} else {
		time.Sleep(300 * time.Millisecond)
	}
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
